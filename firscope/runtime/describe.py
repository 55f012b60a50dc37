"""``firscope check``'s summary of a loaded model: symbols, buffers, weights, kernels, nodes."""
from __future__ import annotations

from ..text import printable
from .plan import NodeKind

__all__ = ["describe_model"]


def describe_model(model) -> str:
    """``firscope check``'s summary: symbols, buffers, weights, kernels and nodes."""
    lines = [f"{model.path}: model '{model.family}', {'f32' if model.fir_f32 else 'q4'} "
             f"linears (group {model.group}), {model.layers} layers, "
             f"loaded in {model.timings.get('total', 0):.2f} s"]
    lines += ["", "symbols:", *_symbol_lines(model), "", "buffers:", *_buffer_lines(model),
              "", "weights:", *_weight_lines(model), "", "kernels:", *_kernel_lines(model)]
    ext = sum(1 for n in model.nodes if n.kind == NodeKind.EXT)
    lines += ["", f"nodes: {len(model.nodes)} ({len(model.nodes) - ext} micro, {ext} ext)"]
    # One display line per entry: names from the model and config files are escaped in it.
    return "\n".join(printable(line) for line in lines)


def _symbol_lines(model) -> list[str]:
    syms = model.symbols
    width = max(len(k) for k in syms) if syms else 0
    lines = []
    for k, v in syms.items():
        shown = str(v.numerator) if getattr(v, "denominator", None) == 1 else f"{float(v):g}"
        lines.append(f"  {k:<{width}} = {shown}")
    return lines


def _buffer_lines(model) -> list[str]:
    lines = []
    total_buf = 0
    for b in model.buffers.values():
        inst = model.layers if b.per_layer else 1
        nbytes = b.size * inst * 4
        total_buf += nbytes
        flags = " ".join(f for f in ("per_layer" if b.per_layer else "",
                                     f"input:{b.input_key}" if b.input_key else "",
                                     f"output:{b.output_key}" if b.output_key else "") if f)
        lines.append(f"  {b.name:<14} f32 {b.size:>10}{f' x{inst}' if inst > 1 else '':>5}"
                     f"  {nbytes:>12,} B  {flags}")
    lines.append(f"  arena: {model.arena.size:,} f32 elements = {model.arena.nbytes:,} bytes "
                 f"(buffers {total_buf:,} B, f32 weights {model.arena.nbytes - total_buf:,} B)")
    return lines


def _weight_lines(model) -> list[str]:
    groups: dict[str, list] = {}
    for w in model.weights.values():
        groups.setdefault(w.decl, []).append(w)
    lines = []
    total_w = 0
    for decl, entries in groups.items():
        w = entries[0]
        nbytes = sum(e.nbytes for e in entries)
        total_w += nbytes
        inst = f"x{len(entries)}" if len(entries) > 1 else ""
        stored = {e.stored for e in entries}
        lines.append(f"  {decl:<8} {w.dtype:<4} {str(list(w.shape)):<14}{inst:>5}  "
                     f"{nbytes:>12,} B  {w.stored if len(stored) == 1 else 'mixed':<12} "
                     f"{w.tensor if len(entries) == 1 else w.tensor + ' ...'}")
        declared = [e for e in entries if e.declared and e.declared != (model.weight_decls[decl]
                                                                        .dtype_at(None, model.group))]
        for e in declared:  # an 'except' clause's layers, one line each
            lines.append(f"    layer {e.layer}: {e.declared:<8} {e.nbytes:>19,} B  {e.stored}")
    lines.append(f"  total: {total_w:,} bytes")
    return lines


def _kernel_lines(model) -> list[str]:
    lines = []
    for k in model.kernels.values():
        uses = sum(1 for n in model.nodes if n.kind == NodeKind.MICRO and n.target == k.name)
        lines.append(f"  {k.name:<16} {len(k.ops):>4} instructions  in={k.n_in} out={k.n_out}  "
                     f"line {k.syntax.loc.line}  used by {uses} nodes")
    return lines
