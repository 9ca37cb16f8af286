"""What a model reads of a raw source line: its tokens, through the model's transform and cut to
the length it takes, and whether it has anything to translate. It holds no model and needs no
torch: the server's own process tokenizes its requests with one (serve/building.py)."""
import logging
from dataclasses import dataclass
from typing import List, Optional

from onmt_lite.constants import EOS

logger = logging.getLogger("onmt_lite")


@dataclass(frozen=True)
class SourceReader:
    """``transform``: raw text -> pieces (transforms.py; None: whitespace-split tokens);
    ``limit``: the tokens kept of a line (0: all); ``lone_eos_empty``: a lone ``</s>`` is
    nothing to translate (CTranslate2's rule: what a Marian tokenizer makes of an empty line)."""
    transform: Optional[object] = None
    limit: int = 0
    lone_eos_empty: bool = False

    def tokens(self, line: str, number: int) -> List[str]:
        """Line ``number``'s tokens, cut to ``limit`` (one warning says so)."""
        tokens = self.transform.encode(line) if self.transform else line.split()
        if self.limit and len(tokens) > self.limit:
            logger.warning("source line %d has %d tokens: truncated to %d", number,
                           len(tokens), self.limit)
            tokens = tokens[:self.limit]
        return tokens

    def empty(self, tokens: List[str]) -> bool:
        return not tokens or (self.lone_eos_empty and tokens == [EOS])
