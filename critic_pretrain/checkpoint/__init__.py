"""The ``step_<n>`` checkpoint tree: its layout and manifest (``layout``), writing a step
atomically and retention (``save``), the manifest built and read (``manifest``), reading it
back (``load``), and the DCP reader that runs
no code from a folder we did not write (``safe_dcp``). Callers use ``from critic_pretrain
import checkpoint as ckpt`` and the names below."""

from .layout import (
    CHECKSUM,
    FORMAT_VERSION,
    LOCK,
    MANIFEST,
    STEP_RE,
    WEIGHTS_FILE,
    StepPaths,
    file_checksum,
    find_checkpoints,
    lock_output_dir,
    missing_path_hint,
    newest_checkpoint,
    remove_unstarted,
    resolve_resume,
    run_folder_problem,
    step_number,
    verify,
)
from .load import load_optimizer, load_resume_state, load_weights
from .manifest import Manifest, build_manifest, library_versions, write_export_manifest
from .save import (
    OPTIM_OPTIONS,
    apply_retention,
    best_steps,
    files_manifest,
    load_rng_state,
    rng_state,
    save_checkpoint,
    save_rng_state,
    set_rng_state,
)

__all__ = ["CHECKSUM", "FORMAT_VERSION", "LOCK", "MANIFEST", "Manifest", "OPTIM_OPTIONS", "STEP_RE", "WEIGHTS_FILE",
    "StepPaths", "apply_retention", "best_steps", "build_manifest", "file_checksum", "files_manifest",
    "find_checkpoints", "library_versions",
    "load_optimizer", "load_resume_state", "load_rng_state", "load_weights", "lock_output_dir",
    "missing_path_hint", "newest_checkpoint", "remove_unstarted", "run_folder_problem",
    "resolve_resume", "rng_state", "save_checkpoint", "save_rng_state", "set_rng_state", "step_number",
    "verify", "write_export_manifest"]
