"""What the adapter tells a client in answer to ``initialize``, and that first answer.

Light on purpose: ``firscope dap`` answers ``initialize`` (and sends
``initialized``) before it imports NumPy, numba or the engine, so an editor
that gives up on a silent adapter (nvim-dap warns after 4 s) hears from it at
once however cold the disk cache is; the model is loaded on ``launch``, with
progress events.
"""
from __future__ import annotations

EXCEPTION_FILTERS = [
    {"filter": "nan", "label": "NaN or Inf written", "default": False,
     "description": "Stop after the first node or instruction that writes NaN or Inf"},
    {"filter": "fault", "label": "Kernel faults", "default": True,
     "description": "Stop on a kernel fault (out of bounds, bad rtou, runaway loop); "
                    "when off, a fault ends the session"},
]
CAPABILITIES = {
    "supportsConfigurationDoneRequest": True,
    "supportsFunctionBreakpoints": True,
    "supportsConditionalBreakpoints": True,
    "supportsHitConditionalBreakpoints": True,
    "supportsLogPoints": True,
    "supportsEvaluateForHovers": True,
    "exceptionBreakpointFilters": EXCEPTION_FILTERS,
    "supportsStepBack": True,
    "supportsSetVariable": True,
    "supportsGotoTargetsRequest": True,
    "supportsDataBreakpoints": True,
    "supportsExceptionInfoRequest": True,
    "supportsReadMemoryRequest": True,
    "supportsTerminateRequest": True,
    "supportsSteppingGranularity": True,
}


def answer_initialize(writer, request: dict) -> dict:
    """Answer an ``initialize`` request and send ``initialized`` right after it (configuration
    requests may come before ``launch``; the adapter holds them until the model is loaded).
    Returns the client's arguments; ValueError when they are not an object."""
    args = request.get("arguments")
    args = {} if args is None else args
    if not isinstance(args, dict):
        raise ValueError("'initialize': 'arguments' must be an object")
    writer.response(request, CAPABILITIES)
    writer.event("initialized")
    return args


def first_message(read, writer) -> tuple[str, object]:
    """Read the client's first message before the engine is imported: an ``initialize``
    request is answered here (``("initialized", its arguments)``); anything else is handed
    on as the adapter's loop would have read it (``message``, ``garbage`` or ``eof``)."""
    try:
        msg = read()
    except Exception as e:  # bad framing: the adapter says so and reads on
        return "garbage", str(e)
    if msg is None:
        return "eof", None
    if msg.get("type") == "request" and msg.get("command") == "initialize":
        try:
            return "initialized", answer_initialize(writer, msg)
        except ValueError:
            pass  # the adapter answers it with the error
    return "message", msg
