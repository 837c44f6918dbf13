"""simspec: a discrete-event performance simulator and cost model for speculative decoding in LLM serving."""

__version__ = "0.1.0"
