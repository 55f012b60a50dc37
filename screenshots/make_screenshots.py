"""Regenerate screenshots/ from real runs of the bundled sample model.

    python screenshots/make_screenshots.py

Writes SVG (Textual's own export) and, when cairosvg is installed, PNG.
Screens: the main view stopped in the attention kernel (80x24, 120x36 and
200x50), registers across lanes with the console, a q4 weight in the buffers
tab, attention heatmaps, the logit lens with a watch list, the profile tab
with quantization error, a kernel edited in place (key E), the help screen, and a broken
model file. Never edit
the images by hand.
"""
from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from firscope.tui.app import FirscopeApp  # noqa: E402

SAMPLE = REPO / "sample_models" / "tiny-gpt2" / "gpt2.fir"


async def settle(app, pilot):
    """Until no worker runs and nothing is queued (workers post messages; let them land)."""
    while True:
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not app.workers._workers and not app.busy and not app.pending:
            await pilot.pause()
            return


async def keys(app, pilot, *ks):
    for k in ks:
        await pilot.press(k)
        await settle(app, pilot)


async def commands(app, pilot, *lines):
    for line in lines:
        app.run_command(line)
        await settle(app, pilot)


PNG_FONT = "DejaVu Sans Mono"  # the PNGs' font (the SVGs name Fira Code)


async def shoot(name, size, script, path=SAMPLE, engine="compiled"):
    app = FirscopeApp(path, prompt_text="def main(", n=12, engine=engine)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await script(app, pilot)
        await settle(app, pilot)
        svg = HERE / f"{name}.svg"
        app.save_screenshot(str(svg))
    try:
        import cairosvg
        # Fira Code is fetched from the web by a browser; cairosvg would fall back to a
        # proportional font (columns drift): render with a monospace font this machine has.
        text = svg.read_text(encoding="utf-8").replace(
            "font-family: Fira Code, monospace;", f"font-family: {PNG_FONT}, monospace;")
        cairosvg.svg2png(bytestring=text.encode("utf-8"), write_to=str(HERE / f"{name}.png"),
                         output_width=size[0] * 14)
    except ImportError:
        pass
    print("wrote", svg.relative_to(REPO))


async def main_view(app, pilot):
    await commands(app, pilot, "break gelu@2", "break token 5")
    await keys(app, pilot, "c", "c", "c")  # gelu@2 in tokens 0..3... then token 5 starts
    await commands(app, pilot, "break g2.attn_decode:158")
    await keys(app, pilot, "c", "s", "s")


async def lanes_view(app, pilot):
    await commands(app, pilot, "break g2.attn_decode:157 if lane == 0")
    await keys(app, pilot, "t", "t", "t", "t", "c", "s", "4")
    await commands(app, pilot, "info lanes R3", "print scores[0:8]")


async def buffers_view(app, pilot):
    await keys(app, pilot, "t", "t", "n", "n", "n")
    app.query_one("#buffers-view").show_name("qkvw@0")


async def attention_view(app, pilot):
    await keys(app, pilot, *["t"] * 9, "2")
    att = app.query_one("#attention-view")
    att.layer_i = 2
    att.head = 1
    att.render_view()


async def lens_view(app, pilot):
    await commands(app, pilot, "display max(abs(x))", "display x[0:4]")
    await keys(app, pilot, *["t"] * 5)
    await commands(app, pilot, "until final_norm")
    await keys(app, pilot, "5")


async def profile_view(app, pilot):
    await keys(app, pilot, *["t"] * 6, "p", "3")


async def kernel_edit_view(app, pilot):
    """Key E at ln1@0: a draft that subtracts beta, assembled and replayed (ctrl+s)."""
    from textual.widgets import TextArea
    await commands(app, pilot, "goto ln1@0")
    await keys(app, pilot, "E")
    area = app.screen.query_one(TextArea)
    area.text = area.text.replace("add 2 2 5", "sub 2 2 5")
    await keys(app, pilot, "ctrl+s")


async def help_view(app, pilot):
    await pilot.press("question_mark")


async def nothing(app, pilot):
    pass


async def main():
    await shoot("main-80x24", (80, 24), main_view)
    await shoot("main-120x36", (120, 36), main_view)
    await shoot("main-200x50", (200, 50), main_view)
    await shoot("lanes-console", (120, 36), lanes_view)
    await shoot("buffers-q4", (120, 36), buffers_view)
    await shoot("attention", (120, 36), attention_view)
    await shoot("lens-watch", (120, 36), lens_view)
    await shoot("profile-quant", (120, 36), profile_view)
    await shoot("kernel-edit", (120, 36), kernel_edit_view)
    await shoot("help", (120, 36), help_view)
    with tempfile.TemporaryDirectory() as tmp:
        broken = Path(tmp) / "tiny-gpt2"
        shutil.copytree(SAMPLE.parent, broken)
        text = (broken / "gpt2.fir").read_text().replace("add 1 1 2", "add 1 1 42", 1)
        (broken / "gpt2.fir").write_text(text)
        await shoot("broken-model", (120, 36), nothing, path=broken / "gpt2.fir")


if __name__ == "__main__":
    asyncio.run(main())
