"""Opening a run: the model files, the tokenizer, the prompt as ids, and the output paths.

Every front end (the command line, batch debugging, the profiler, the UI)
opens a model here, with plain values rather than an argparse namespace, so
the rules are the same everywhere: which file a folder stands for, what a
prompt means without a tokenizer, which ids are in the vocabulary.

Output files are checked before the run (a folder that cannot be written is
reported before minutes of profiling, not after) and written without
following a link already at the destination: each file is written under a
fresh temporary name beside it and renamed over the destination, so a
symlink planted in a report folder (or at an output path) is replaced, never
written through, and a failed write leaves the previous file as it was.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..defaults import DEFAULT_GROUP
from ..errors import FirError
from ..text import printable, undecodable

if TYPE_CHECKING:  # the model layer is imported when a model is opened, not before
    from ..model.tokens import Tokenizer
    from .load import Model

__all__ = ["DEFAULT_PROMPT", "DEFAULT_GROUP", "RunInput", "Opened", "resolve_model",
           "open_model", "prompt_ids", "refuse_prompt_early", "check_steps", "check_budget",
           "check_text", "check_output_folder",
           "check_output_file", "check_npy_replaceable", "write_output", "write_into_folder"]

DEFAULT_PROMPT = "    if "  # the prompt when none is given (the UI shows it being completed)
MAX_GROUP = 1 << 20


def resolve_model(arg: str | os.PathLike | None) -> Path:
    """The .fir file a command-line argument names: the bundled sample for None; for a
    folder, its gpt2.fir or its only .fir file."""
    from ..samples import default_model
    if arg is None:
        return default_model()
    path = Path(arg)
    if path.is_dir():
        cand = path / "gpt2.fir"
        if cand.exists():
            return cand
        firs = sorted(path.glob("*.fir"))
        if len(firs) == 1:
            return firs[0]
        raise FirError(f"{path}: a folder; give the .fir file inside it")
    return path


def open_model(path: str | os.PathLike | None, *, fir_f32: bool = False,
               group: int = DEFAULT_GROUP, q4_path: str = "packed",
               progress: Callable[[str, float], None] | None = None,
               warm: bool = True) -> "Model":
    """Load and check the model ``path`` names (see :func:`resolve_model`); ``warm``: as
    load_model's."""
    if not 1 <= group <= MAX_GROUP:
        raise FirError(f"--group {group}: must be a positive group size")
    from .load import load_model  # the one place a front end loads a model
    return load_model(resolve_model(path), fir_f32=fir_f32, group=group, q4_path=q4_path,
                      progress=progress, warm=warm)


def check_text(text: str, what: str) -> str:
    """``text`` if it is all UTF-8; else a FirError naming the first byte that is not.

    Python hands bytes of argv and file names that are not UTF-8 on as lone
    surrogates, which no tokenizer can encode.
    """
    bad = undecodable(text)
    if bad is not None:
        raise FirError(f"{what}: {bad}")
    return text


def prompt_ids(model: "Model", *, prompt: str | None = None,
               tokens: str | Sequence[int] | None = None) -> tuple[list[int], "Tokenizer"]:
    """The prompt as token ids, and the model's tokenizer.

    ``tokens`` (text like ``"1,2,3"`` or ids) wins over ``prompt``; with neither,
    :data:`DEFAULT_PROMPT` is encoded. Every id is checked against the vocabulary.
    """
    from ..model.tokens import load_tokenizer, parse_token_list
    tok = load_tokenizer(model.folder, model.vocab)
    if tokens is not None:
        ids = parse_token_list(tokens) if isinstance(tokens, str) else [int(t) for t in tokens]
        if not ids:
            raise FirError("--tokens: no token ids given")
    else:
        ids = tok.encode(check_text(DEFAULT_PROMPT if prompt is None else prompt, "--prompt"))
        if not ids:
            raise FirError("--prompt: the prompt encodes to no tokens")
    for i in ids:
        if not 0 <= i < model.vocab:
            raise FirError(f"token id {i} is outside the vocabulary 0..{model.vocab - 1}")
    return ids, tok


def refuse_prompt_early(fir_path: Path, prompt: str | None, tokens) -> None:
    """Before loading anything: a prompt text needs a tokenizer, and a model folder with no
    tokenizer.json whose config.json says a vocabulary other than 256 bytes has none. (The
    full check, from the loaded model's logits, still runs after loading.)"""
    folder = Path(fir_path).parent
    if prompt is None or tokens is not None or (folder / "tokenizer.json").exists():
        return
    try:
        from ..model.config import load_config
        vocab = load_config(folder / "config.json").get("vocab_size")
    except FirError:
        return  # no readable config.json here: the load says what is wrong
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab != 256:
        from ..model.tokens import NoTokenizer
        NoTokenizer(vocab, folder).encode(prompt)  # raises, in the words the load would use


def check_steps(n: int) -> int:
    """``n`` tokens to generate: 0 or more (the rule behind every ``-n``)."""
    if n < 0:
        raise FirError("-n must be 0 or more")
    return n


def check_budget(budget: int | None) -> int:
    """``--budget N`` (instructions one kernel may execute): at least 1; None (not given)
    is the machine's default. The rule behind every ``--budget``."""
    if budget is None:
        from .machine import DEFAULT_BUDGET  # the machine (and NumPy) only when needed
        return DEFAULT_BUDGET
    if budget < 1:
        raise FirError(f"--budget {budget}: must be at least 1 instruction")
    return budget


@dataclass(frozen=True)
class Opened:
    model: "Model"
    ids: tuple[int, ...]
    tokenizer: "Tokenizer"


@dataclass(frozen=True)
class RunInput:
    """What a command opens, as the user gave it: the model and the prompt."""

    model: str | None = None  # a .fir file, a folder holding one, or None: the bundled sample
    fir_f32: bool = False
    group: int = DEFAULT_GROUP
    prompt: str | None = None
    tokens: str | tuple[int, ...] | None = None  # wins over prompt
    q4_path: str = "packed"  # or "dequant": f32 copies of q4 matrices (for comparison)

    def open(self, progress: Callable[[str, float], None] | None = None, *,
             warm: bool = True) -> Opened:
        model = self.load(progress, warm=warm)
        ids, tok = self.ids(model)
        return Opened(model, tuple(ids), tok)

    def load(self, progress: Callable[[str, float], None] | None = None, *,
             warm: bool = True) -> "Model":
        """The model alone (``diff`` loads both sides before it reads the prompt); ``warm``:
        as load_model's."""
        return open_model(self.model, fir_f32=self.fir_f32, group=self.group,
                          q4_path=self.q4_path, progress=progress, warm=warm)

    def ids(self, model: "Model") -> tuple[list[int], "Tokenizer"]:
        """The prompt as ids of ``model`` (see :func:`prompt_ids`), and its tokenizer."""
        return prompt_ids(model, prompt=self.prompt, tokens=self.tokens)


# -- output paths ---------------------------------------------------------------------------------
def _path_of(path: str | os.PathLike, what: str) -> Path:
    text = os.fspath(path)
    if not text:  # Path("") is the current folder: never what the user meant
        raise FirError(f"{what}: the path is empty")
    if "\0" in text:
        raise FirError(f"{what}: a path cannot hold a NUL character")
    return Path(path)


def _os_error(path: Path, doing: str, e: OSError) -> FirError:
    return FirError(f"{printable(path)}: cannot {doing}: {e.strerror or e}")


def _probe(folder: Path, doing: str) -> None:
    """Create and remove a file in ``folder``: only an actual write proves it is writable
    (``os.access`` says yes to root on a read-only file system)."""
    probe = folder / f".firscope-probe-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise _os_error(folder, doing, e) from None


def check_output_folder(path: str | os.PathLike, what: str = "-o") -> Path:
    """Create the folder ``path`` if needed and check that files can be written in it."""
    out = _path_of(path, what)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise FirError(f"{printable(out)}: cannot create the report folder: it exists and "
                       "is not a folder") from None
    except OSError as e:
        raise _os_error(out, "create the report folder", e) from None
    _probe(out, "write into the report folder")
    return out


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """Check before a run that exactly ``path`` can be written afterwards: a new name or a
    regular file in a folder that exists (the rule of :func:`firscope.dump.check_output_target`:
    links, devices and FIFOs are refused)."""
    out = _path_of(path, what)
    _check_target(out, what)
    folder = out.parent
    if not folder.is_dir():
        raise FirError(f"{printable(out)}: cannot write there: folder "
                       f"{printable(folder)} does not exist")
    _probe(folder, "write there")
    return out


NPY_MAGIC = b"\x93NUMPY"


def check_npy_replaceable(path: str | os.PathLike, what: str) -> None:
    """An output written as ``.npy`` (``--logits-out``) replaces an existing file only when
    that file is a ``.npy`` itself: a typo must not turn the model file, its config or its
    checkpoint (the run's own inputs) or any other file into logits."""
    p = Path(path)
    try:
        if not p.is_file() or p.is_symlink() or p.stat().st_size == 0:
            return  # new, empty, or refused by the target check for what it is
        with open(p, "rb") as f:
            head = f.read(len(NPY_MAGIC))
    except OSError:
        return  # the write says what is wrong
    if head != NPY_MAGIC:
        raise FirError(f"{printable(p)}: exists and is not a .npy file; {what} replaces only "
                       "a previous .npy (remove the file or choose another name)")


def _check_target(out: Path, what: str) -> None:
    from ..dump import check_output_target
    try:
        check_output_target(out)
    except IsADirectoryError:
        raise FirError(f"{printable(out)}: is a folder; {what} needs a file name") from None
    except OSError as e:
        raise FirError(f"{printable(out)}: cannot write {what} there: {e.strerror}") from None


def check_distinct_outputs(*named: tuple[str, str | os.PathLike | None]) -> None:
    """Refuse two outputs (``(flag, path)`` pairs; None: not given) that name one file,
    spelled alike or not (``a/../x``, a link to the folder, a hard link): the second
    write would replace the first."""
    seen: list[tuple[str, str, os.PathLike]] = []
    for flag, path in named:
        if path is None:
            continue
        real = os.path.realpath(path)
        for other_flag, other_real, other in seen:
            if real == other_real or _same_file(path, other):
                raise FirError(f"{printable(str(path))}: {other_flag} and {flag} name the "
                               "same file; give each its own")
        seen.append((flag, real, path))


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _replace(final: Path, data: bytes) -> None:
    """Write ``data`` to a new file beside ``final`` and rename it over ``final``."""
    tmp = final.parent / f".{final.name[:64]}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # new: never a link
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, final)  # replaces a link at ``final`` itself, not what it points to
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_output(path: str | os.PathLike, data: bytes, what: str) -> Path:
    """Write ``data`` to exactly the file ``path`` names, keeping the old file if the write
    fails: a new file beside it, renamed over it. ``path`` must be new or a regular file
    (links, devices and FIFOs are refused, see :func:`check_output_file`)."""
    out = _path_of(path, what)
    _check_target(out, what)
    try:
        _replace(out, data)
    except OSError as e:
        raise _os_error(out, f"write {what}", e) from None
    return out


def write_into_folder(folder: Path, name: str, data: bytes | str) -> Path:
    """Write the file ``name`` firscope chose inside ``folder``, never following a link or
    writing into a device already there. Raises OSError."""
    if isinstance(data, str):
        data = data.encode("utf-8", errors="backslashreplace")
    final = folder / name
    _replace(final, data)
    return final
