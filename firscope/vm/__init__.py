"""One opcode table; assembler; SIMT step interpreter; compiled kernels."""
