"""firscope.debug"""
