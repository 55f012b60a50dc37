"""firscope.profile"""
