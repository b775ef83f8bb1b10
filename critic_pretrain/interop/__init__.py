"""Everything about the PPO frameworks that load our critics: what each one loads
(``frameworks``), the seed check (``check``), the exports (``export``; ``export_files``, the
writing they share; ``export_heads``, ROLL's and SkyRL's head layouts) and the reader for
torch.distributed.checkpoint folders (``dcp``). Import the submodules directly.
"""
