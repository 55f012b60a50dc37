"""Issue 23: a dump file is read robustly - rewritten while open (no SIGBUS), npz
members that cannot be read (encrypted, unknown compression), metadata and member
headers that claim more than the file holds."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

from firscope.cli import main
from firscope.compare.dumpfile import Dump
from firscope.errors import FirError


def _fs(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, out, err


def _dump(capsys, model, path):
    code, _, err = _fs(capsys, "run", model, "--tokens", "1,2", "-n", "1", "--engine",
                       "interp", "--dump", path)
    assert code == 0, err
    return path


@pytest.mark.parametrize("suffix, rewrite", [
    (".safetensors", "open(path, 'wb').close()"),  # truncated in place, as open('wb') does
    (".safetensors", "np.savez(open(path, 'wb'), x=np.zeros(3))"),
    (".npz", "open(path, 'wb').write(b'PK' + bytes(10))"),
])
def test_a_dump_rewritten_while_open_is_reported_never_a_sigbus(random_model, tmp_path, capsys,
                                                                suffix, rewrite):
    path = _dump(capsys, random_model, tmp_path / f"d{suffix}")
    script = textwrap.dedent(f"""
        import numpy as np
        from firscope.compare.dumpfile import Dump
        from firscope.errors import FirError
        path = {str(path)!r}
        d = Dump(path)
        key = sorted(d.entries)[0]
        held = d.read(key)           # what a session keeps showing
        before = float(held.sum())
        {rewrite}
        print("held", float(held.sum()) == before)   # touching it must not kill us
        try:
            d.read(sorted(d.entries)[-1])
        except FirError as e:
            print("error", e)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # -7 was SIGBUS
    assert "held True" in r.stdout
    assert "the dump changed on disk since it was opened" in r.stdout, r.stdout


def test_a_dump_replaced_by_rename_is_reported_too(random_model, tmp_path, capsys):
    path = _dump(capsys, random_model, tmp_path / "d.safetensors")
    d = Dump(path)
    key = sorted(d.entries)[0]
    first = d.read(key).copy()
    _dump(capsys, random_model, tmp_path / "d.safetensors")  # written beside, renamed over
    with pytest.raises(FirError, match="the dump changed on disk"):
        d.read(key)
    assert np.array_equal(Dump(path).read(key), first)


def _patch_member(path, member: str, *, flags: int = 0, method: int | None = None) -> None:
    """Set general-purpose flag bits and/or the compression method of one member, in
    both its local header and the central directory."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
        local, central = info.header_offset, None
    name = member.encode()
    at = data.find(b"PK\x01\x02")
    while at != -1:
        n = int.from_bytes(data[at + 28: at + 30], "little")
        if data[at + 46: at + 46 + n] == name:
            central = at
        at = data.find(b"PK\x01\x02", at + 4)
    assert central is not None
    for where, flag_at, method_at in ((local, 6, 8), (central, 8, 10)):
        f = int.from_bytes(data[where + flag_at: where + flag_at + 2], "little") | flags
        data[where + flag_at: where + flag_at + 2] = f.to_bytes(2, "little")
        if method is not None:
            data[where + method_at: where + method_at + 2] = method.to_bytes(2, "little")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how, why", [({"flags": 1}, "encrypted"),
                                      ({"method": 97}, "compression method")])
def test_an_unreadable_npz_member_is_a_clean_error_in_diff_debug_and_profile(
        random_model, tmp_path, capsys, how, why):
    path = _dump(capsys, random_model, tmp_path / "d.npz")
    with zipfile.ZipFile(path) as z:
        member = sorted(n for n in z.namelist() if n.startswith("step"))[0]
    _patch_member(path, member, **how)
    for argv in (("diff", random_model, "--against", path, "--engine", "interp"),
                 ("debug", random_model, "--against", path, "--engine", "interp",
                  "--tokens", "1,2", "-x", "/dev/null"),
                 ("profile", random_model, "--against", path, "--engine", "interp",
                  "--tokens", "1,2", "-n", "1", "-o", tmp_path / "rep")):
        code, _, err = _fs(capsys, *argv)
        # diff's documented status for an unreadable file is 2; the others exit 1
        assert code == (2 if argv[0] == "diff" else 1), (argv[0], code, err)
        assert f"cannot read member '{member}' of {path}" in err and why in err, err


def _npy_header_only(shape, descr: str, payload: bytes = b"") -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue() + payload


def test_metadata_claiming_huge_sizes_is_ignored_with_a_warning(random_model, tmp_path,
                                                                capsys):
    good = _dump(capsys, random_model, tmp_path / "good.npz")
    path = tmp_path / "meta.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for n in src.namelist():
            if not n.startswith("__metadata__"):
                dst.writestr(n, src.read(n))
        dst.writestr("__metadata__.npy", _npy_header_only((10 ** 13,), "<U1", b"x" * 64))
    d = Dump(path)
    assert d.metadata == {}
    assert any("the metadata member claims" in w and "ignored" in w for w in d.warnings), \
        d.warnings
    code, out, err = _fs(capsys, "diff", random_model, "--against", path, "--engine",
                         "interp", "--tokens", "1,2")
    assert code == 0, err
    assert "out of memory" not in err and "the metadata member claims" in err + out


def test_a_member_header_claiming_more_than_it_holds_is_a_clean_error(random_model, tmp_path,
                                                                      capsys):
    path = tmp_path / "big.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("step0/x@0/out.npy", _npy_header_only((10 ** 12,), "<f4", b"\0" * 16))
    with pytest.raises(FirError, match=r"cannot read member 'step0/x@0/out.npy' of .*big.npz: "
                                       r"its header claims 4000000000000 bytes"):
        Dump(path)


def test_metadata_of_invalid_code_points_is_ignored_with_a_warning(tmp_path):
    """Found by fuzz.py (dumpfile, seed 23): a <U1 metadata member whose bytes are not
    code points made numpy raise SystemError."""
    path = tmp_path / "cp.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__metadata__.npy", _npy_header_only((4,), "<U1", b"x" * 16))
        z.writestr("step0/x@0/out.npy", _npy_header_only((1,), "<f4", b"\0" * 4))
    d = Dump(path)
    assert d.metadata == {} and any("not a JSON string" in w for w in d.warnings), d.warnings


def test_a_zip_of_an_unknown_version_is_a_clean_error(random_model, tmp_path, capsys):
    """Found by fuzz.py (dumpfile, seed 7): 'extract version 22.8' raised
    NotImplementedError from zipfile while the dump was opened."""
    path = _dump(capsys, random_model, tmp_path / "v.npz")
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    data[at + 6: at + 8] = (228).to_bytes(2, "little")  # version needed to extract
    path.write_bytes(bytes(data))
    with pytest.raises(FirError, match=r"v\.npz: not a readable \.npz \(zip\) file: zip file "
                                       r"version 22\.8"):
        Dump(path)
