"""New content for a Static or an OptionList without laying the whole screen out again
where its size stays.

Textual's ``Static.update`` asks for a layout of the screen by default: every widget
placed again (~7 ms at 120x36 with firscope's panes) and then every pane repainted, not
only the one whose text changed. A step key updates about ten Statics (status bar,
registers, lanes, watch, tokens, buffer statistics...), most of them of a fixed size or
with as many lines as before: :func:`update` asks for the layout only where the new
content can change the widget's size, and :func:`show_options` replaces only the
options that changed. What else a step key would draw again for nothing: a list's every
row when its highlight moves (:class:`RowList`), a pane's every line when its border title
is set to the same text (:func:`set_border`), a Rich table twice (:func:`drawn`).
"""
from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option


def shows_already(widget: Static, content) -> bool:
    """``widget`` shows ``content`` already: the same string, or a rich Text of the same
    characters, spans and base style (rich's own ``==`` compares characters and spans only:
    a dimmed text would equal the plain one). Other renderables (tables) are never equal."""
    old = widget.content
    if type(old) is not type(content):
        return False
    if isinstance(content, str):
        return old == content
    if isinstance(content, Text):
        return (old.plain == content.plain and old.spans == content.spans
                and old.style == content.style and old.end == content.end
                and (old.justify, old.overflow, old.no_wrap, old.tab_size)
                == (content.justify, content.overflow, content.no_wrap, content.tab_size))
    return False


def hidden(widget: Static) -> bool:
    """``widget`` or a container of it is not displayed (laid out when it is shown)."""
    return not all(node.display for node in widget.ancestors_with_self)


def update(widget: Static, content="") -> None:
    """``widget.update(content)``, with a layout of the screen only where it is needed: the
    widget's width is ``auto``, or its height is and the content's height at the widget's
    width is not the height it has now. A hidden widget (itself or a container of it not
    displayed: the registers tab on a wide screen, a tab not shown) is laid out when it is
    shown, so it needs none now either. Content the widget shows already (a step that
    changes nothing in it: the watch list, the token strip, the buffers' statistics) is
    neither laid out nor drawn again."""
    if shows_already(widget, content):
        return
    if hidden(widget):
        widget.update(content, layout=False)
        return
    styles = widget.styles
    width, height = styles.width, styles.height
    if width is not None and width.is_auto:
        widget.update(content)
        return
    shown = widget.content_size
    widget.update(content, layout=False)
    if height is not None and not height.is_auto:
        return
    if widget.get_content_height(shown, shown, shown.width) != shown.height:
        widget.refresh(layout=True)


def drawn(widget: Static, renderable, width: int):
    """A Rich renderable other than a text (a table) drawn once, at ``width``, as the Text of
    its lines; a text, or with no width yet (hidden), as it is. Textual draws a table twice
    at each update (to measure its height, then to show it), and :func:`shows_already`
    never takes two tables as the same: the registers' table was drawn twice at every step
    key, in a kernel or not. The caller draws it again when the widget's width changes."""
    if isinstance(renderable, (str, Text)) or width <= 0:
        return renderable
    app = widget.app
    options = app.console_options.update_width(width).update(highlight=False)
    out = Text()
    for i, line in enumerate(app.console.render_lines(renderable, options, pad=False)):
        if i:
            out.append("\n")
        for segment in line:
            if not segment.control:
                out.append(segment.text, segment.style)
    return out


def update_at_least(widget: Static, content, rows: int) -> int | None:
    """``widget.update(content)`` for a Static of varying height, made ``rows`` high where
    its content is shorter: the caller keeps room for what it will show next (the
    registers pane: the next kernel's registers while it says "no kernel running"), so
    that step lays nothing out (Textual lays the whole screen out twice for a widget whose
    height changes: once for the new content, once for its new size). Content taller
    than ``rows`` takes its own height: nothing is cut off. Returns the content's own
    height, or None where the widget is hidden (no width yet: it takes its content's height
    when shown) or its width is ``auto`` (it is updated as :func:`update` does)."""
    styles = widget.styles
    width = widget.content_size.width
    if (styles.width is not None and styles.width.is_auto) or width <= 0 or hidden(widget):
        if styles.height is not None and not styles.height.is_auto:
            styles.height = "auto"
        update(widget, content)
        return None
    if not shows_already(widget, content):
        widget.update(content, layout=False)
    size = widget.content_size
    need = widget.get_content_height(size, size, width)
    tall = max(need, rows)
    if styles.height is None or styles.height.is_auto or styles.height.cells != tall:
        styles.height = tall  # a layout, only when the height changes
    return need


class RowList(OptionList):
    """An OptionList whose highlight, moving, repaints the rows it leaves and takes: Textual's
    ``highlighted`` repaints every visible row (the graph's ▶ follows the stop: a whole list
    at every step key). Scrolling to the highlight still repaints what scrolled."""

    highlighted: reactive[int | None] = reactive(None, repaint=False)
    _resized_to: int | None = None  # the width of the last resize

    def _on_resize(self, event) -> None:
        """Textual's OptionList forgets its rendered rows at every resize; shown again at
        the width it had (the kernel's list after a linear's text) they are still right,
        and were drawn once already: kept."""
        width = self.scrollable_content_region.width
        if width == self._resized_to and width > 0:
            event.prevent_default()  # OptionList's own _on_resize is not called
        self._resized_to = width

    def _watch_highlighted(self, old: int | None, new: int | None) -> None:
        lines, heights = _line_table(self)
        for index in {old, new} - {None}:
            if index in lines and index in heights:
                self.refresh_lines(lines[index], heights[index])
            else:  # not laid out yet, or not Textual 8's list: all of it
                self.refresh()


def set_border(widget, title: str | None = None, subtitle: str | None = None) -> None:
    """The widget's border title and subtitle (None: left as they are), set only where they
    change: Textual's setter repaints the whole widget, for a pane every line of every
    widget in it, even for the text it shows already (the graph's "61 nodes" at every
    step key)."""
    if title is not None and widget.border_title != title:
        widget.border_title = title
    if subtitle is not None and widget.border_subtitle != subtitle:
        widget.border_subtitle = subtitle


def show_options(widget: OptionList, options: list[Option]) -> None:
    """The list's options become ``options``. Where they are the options it shows (the same
    ids and disabled flags in the same order: the same kernel, nodes or layers), only the
    prompts that changed are replaced; else all are set at once (``clear_options`` then
    ``add_options`` would lay the screen out twice, the list empty and then full, its
    scrollbar hidden and shown again). The caller sets the highlight."""
    old = widget.options
    if len(old) == len(options) and all(a.id == b.id and a.disabled == b.disabled
                                        for a, b in zip(old, options)):
        changed = [(k, b.prompt) for k, (a, b) in enumerate(zip(old, options))
                   if a.prompt is not b.prompt and a.prompt != b.prompt]
        if changed and not _replace_prompts(widget, changed):
            for k, prompt in changed:
                widget.replace_option_prompt_at_index(k, prompt)
    else:
        widget.set_options(options)


def _replace_prompts(widget: OptionList, changed: list[tuple[int, Text]]) -> bool:
    """Replace the prompts at these indices and re-render only their lines; False (nothing
    done) where that cannot be done here.

    Textual's ``replace_option_prompt_at_index`` forgets every option's rendered lines and
    the list's line table: a step key that moves the graph's ``▶`` (two of its rows)
    rendered every visible row again from its text, three times a key. Where each changed
    option keeps its height (firscope's rows are one line, never wrapped), only the changed
    options' rendered lines are dropped and only their lines repainted. This reads
    OptionList's internals (Textual 8: its render cache, line table and option visuals);
    where they are not there (another Textual) it returns False and the caller makes the
    public call (tests/test_tui_layout.py checks that this path is the one taken)."""
    cache = getattr(widget, "_option_render_cache", None)
    lines, heights = _line_table(widget)
    needed = (hasattr(cache, "keys") and hasattr(cache, "discard") and bool(heights)
              and all(hasattr(widget, m) for m in ("_get_visual", "_clear_caches",
                                                    "_get_left_gutter_width"))
              and all(hasattr(widget.get_option_at_index(k), "_set_prompt")
                      for k, _ in changed))
    if not needed:
        return False
    padding = widget.get_component_styles("option-list--option").padding
    width = (widget.scrollable_content_region.width - widget._get_left_gutter_width()
             - padding.width)
    if width <= 0:  # hidden: its lines are made when it is shown
        return False
    options = [widget.get_option_at_index(k) for k, _ in changed]
    same_height = True
    for opt, (k, prompt) in zip(options, changed):
        opt._set_prompt(prompt)
        height = (widget._get_visual(opt).get_height(widget.styles, width)
                  + getattr(opt, "_divider", False))
        same_height = same_height and heights.get(k) == height
    if not same_height:  # the list's lines move: laid out again, as Textual does
        widget._clear_caches()
        return True
    gone = set(options)
    for key in list(cache.keys()):
        if key[0] in gone:
            cache.discard(key)
    for k, _ in changed:
        widget.refresh_lines(lines[k], heights[k])
    return True


def _line_table(widget: OptionList) -> tuple[dict[int, int], dict[int, int]]:
    """Textual 8's OptionList line table as it stands: option index -> its first line, and
    -> its height in lines; empty where the list has not laid its options out, or has no
    such table (another Textual)."""
    table = getattr(widget, "_line_cache", None)
    lines, heights = getattr(table, "index_to_line", None), getattr(table, "heights", None)
    if not isinstance(lines, dict) or not isinstance(heights, dict):
        return {}, {}
    return lines, heights
