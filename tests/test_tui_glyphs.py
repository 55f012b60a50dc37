"""The UI shows token pieces with characters every font has (issue 26, item 16): ``␠`` and
``⏎`` (Control Pictures) are boxes in browsers with Debian's default fonts, in ``serve``
and in the cairosvg screenshots; the UI uses the report's mapping (``·``, ``↵``)."""
import pytest

from firscope.text import web_piece
from test_tui import SIZES, make_app
from tui_util import press, run, screen_text, wait_loaded


@pytest.mark.parametrize("size", SIZES)
def test_token_strip_and_header_show_space_and_newline_as_dot_and_arrow(size):
    async def go():
        app = make_app(prompt_text="a b\nc", n=2)
        async with app.run_test(size=size) as pilot:
            await wait_loaded(app, pilot)
            await press(app, pilot, "n")
            assert app.view.pieces[:5] == ("a", "·", "b", "↵", "c")
            screen = screen_text(app)
            assert "␠" not in screen and "⏎" not in screen
            assert "a·b↵c" in screen.replace(" ", "")  # the token strip
            app.run_command("until token 1")  # the header's current token: the space
            await wait_loaded(app, pilot)
            assert "'·'" in app.view.place and "␠" not in screen_text(app)
    run(go())


def test_the_report_and_the_ui_share_one_mapping():
    assert web_piece("a␠b⏎⇥␁␡") == "a·b↵→\\x01\\x7f"
    from firscope.profile import html
    assert html.web_piece is web_piece
