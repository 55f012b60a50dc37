"""Text -> syntax tree with source positions; exact expressions."""
from .parser import parse_file, parse_text

__all__ = ["parse_file", "parse_text"]
