"""One record source per dump format, behind one registry (``SOURCES``): each turns one record of
its dump into one row of schema columns; ``rollouts.convert`` drives any of them."""

from .base import MISSING, BadFile, BadRow, Source, lookup, prompt_hash, short, show
from .generic import GenericSource
from .nemo_rl import NemoRLSource
from .slime import SlimeSource
from .verl import VerlSource

SOURCES = {"nemo-rl": NemoRLSource, "slime": SlimeSource, "verl": VerlSource, "generic": GenericSource}
"""``rollouts convert --from NAME``: the source class of each dump format."""

__all__ = ["MISSING", "SOURCES", "BadFile", "BadRow", "GenericSource", "NemoRLSource", "SlimeSource", "Source",
           "VerlSource", "lookup", "prompt_hash", "show", "short"]
