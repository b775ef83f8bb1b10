"""One record source per dump format, behind one registry (``SOURCES``): each turns one record of
its dump into one row of schema columns; ``rollouts.convert`` drives any of them."""

from .base import MISSING, BadFile, BadRow, Source, lookup, short, show
from .generic import GenericSource
from .nemo_rl import NemoRLSource

SOURCES = {"nemo-rl": NemoRLSource, "generic": GenericSource}
"""``rollouts convert --from NAME``: the source class of each dump format."""

__all__ = ["MISSING", "SOURCES", "BadFile", "BadRow", "GenericSource", "NemoRLSource", "Source", "lookup", "show",
           "short"]
