"""Regenerate screenshots/ from real runs of the bundled sample model.

    python screenshots/make_screenshots.py

Writes SVG (Textual's own export) and, when cairosvg is installed, PNG.
Screens: the main view stopped in the attention kernel (120x36 and 200x50),
registers across lanes, a q4 weight in the buffers tab, attention heatmaps,
the profile tab with quantization error, the help screen, and a broken model
file. Never edit the images by hand.
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


async def wait(app, pilot, attr="busy", timeout=120.0):
    await pilot.pause(0.05)
    for _ in range(int(timeout / 0.05)):
        if attr == "loaded" and (app.session is not None or app.load_error is not None):
            return
        if attr == "busy" and not app.busy:
            await pilot.pause(0.05)
            return
        await pilot.pause(0.05)


async def keys(app, pilot, *ks):
    for k in ks:
        await pilot.press(k)
        await wait(app, pilot)


async def shoot(name, size, script, path=SAMPLE, engine="compiled"):
    app = FirscopeApp(path, prompt_text="def main(", n=12, engine=engine)
    async with app.run_test(size=size) as pilot:
        await wait(app, pilot, "loaded")
        await script(app, pilot)
        await pilot.pause(0.2)
        svg = HERE / f"{name}.svg"
        app.save_screenshot(str(svg))
    try:
        import cairosvg
        cairosvg.svg2png(url=str(svg), write_to=str(HERE / f"{name}.png"),
                         output_width=size[0] * 14)
    except ImportError:
        pass
    print("wrote", svg.relative_to(REPO))


async def main_view(app, pilot):
    app.session.add_breakpoint("gelu@2")
    app.session.add_breakpoint("token 5")
    await keys(app, pilot, "c", "c", "c")  # gelu@2 in tokens 0..3... then token 5 starts
    app.session.add_breakpoint("g2.attn_decode:158")
    await keys(app, pilot, "c", "s", "s")


async def lanes_view(app, pilot):
    app.session.add_breakpoint("g2.attn_decode:157 if lane == 0")
    await keys(app, pilot, "t", "t", "t", "t", "c", "s")
    app.action_tab("console")
    app.run_command("info lanes R3")
    app.run_command("print scores[0:8]")
    await pilot.pause(0.1)


async def buffers_view(app, pilot):
    await keys(app, pilot, "t", "t", "n", "n", "n")
    app.action_tab("buffers")
    await pilot.pause(0.1)
    app.query_one("#buffers-view").show_name("qkvw@0")


async def attention_view(app, pilot):
    await keys(app, pilot, *["t"] * 9)
    app.action_tab("attention")
    att = app.query_one("#attention-view")
    att.layer_i = 2
    att.head = 1
    att.show()


async def profile_view(app, pilot):
    await keys(app, pilot, *["t"] * 6, "p")
    app.action_tab("profile")


async def help_view(app, pilot):
    await pilot.press("question_mark")


async def nothing(app, pilot):
    pass


async def main():
    await shoot("main-120x36", (120, 36), main_view)
    await shoot("main-200x50", (200, 50), main_view)
    await shoot("lanes-console", (120, 36), lanes_view)
    await shoot("buffers-q4", (120, 36), buffers_view)
    await shoot("attention", (120, 36), attention_view)
    await shoot("profile-quant", (120, 36), profile_view)
    await shoot("help", (120, 36), help_view)
    with tempfile.TemporaryDirectory() as tmp:
        broken = Path(tmp) / "tiny-gpt2"
        shutil.copytree(SAMPLE.parent, broken)
        text = (broken / "gpt2.fir").read_text().replace("add 1 1 2", "add 1 1 42", 1)
        (broken / "gpt2.fir").write_text(text)
        await shoot("broken-model", (120, 36), nothing, path=broken / "gpt2.fir")


if __name__ == "__main__":
    asyncio.run(main())
