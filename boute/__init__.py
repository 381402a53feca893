"""BOute: co-optimised query routing and heterogeneous GPU deployment for LLM serving."""

__version__ = "0.1.0"
