"""qola: manifest-driven ahead-of-time builder for JIT-first GPU kernel libraries."""

__version__ = "0.1.0"
