"""Everything about the PPO frameworks that load our critics: what each one loads
(``frameworks``), the seed check (``check``), the exports (``export``) and the reader for
torch.distributed.checkpoint folders (``dcp``). Import the submodules directly.
"""
