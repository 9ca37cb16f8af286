"""The networks: encoders, decoders with map_state, the generator. No search code here."""
from onmt_lite.models.model import NMTModel, build_model

__all__ = ["NMTModel", "build_model"]
