"""The rollout data layer: schema v1, readers, validation, converters, synthetic data.

Imports pyarrow and numpy only (no torch), so data tools run anywhere.
"""

from pathlib import Path

from .errors import Problem, RolloutError
from .paths import resolve
from .reader import RolloutReader, Summary, check
from .schema import COLUMNS, SCHEMA_VERSION
from .writer import ShardWriter, table_from_rows, write_rows

SAMPLE_DIR = Path(__file__).parent / "sample"
"""The bundled sample archive (synthetic rollouts with oracle values): the demo's default."""

__all__ = ["COLUMNS", "SCHEMA_VERSION", "SAMPLE_DIR", "Problem", "RolloutError", "RolloutReader",
           "ShardWriter", "Summary", "check", "resolve", "table_from_rows", "write_rows"]
