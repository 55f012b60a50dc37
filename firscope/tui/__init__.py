"""firscope.tui"""
