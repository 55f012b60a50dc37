"""Text -> syntax tree with source positions; exact expressions."""
from .expr import Env, SymbolTable, eval_f32, eval_int, evaluate, parse_expr
from .parser import parse_file, parse_text
from .source import read_limited, regular_file_size

__all__ = ["Env", "SymbolTable", "eval_f32", "eval_int", "evaluate", "parse_expr", "parse_file",
           "parse_text", "read_limited", "regular_file_size"]
