"""The report page's cells: numbers, intervals, tables and cards as escaped HTML (model.evaluation.report.report_html).

One spelling of an interval for the whole page. An interval of zero width is never printed: a bootstrap
of a handful of cases can collapse to a point (every resample has the same AUROC), which reads as
certainty where there is least of it, so such a cell says the interval is not estimable at this size.
A cell the small-sample rule marks not estimable (``"estimable": False``) shows no number at all, only
why. An estimate with an interval is rounded to the decimals its standard error supports
(small_sample.supported_decimals; ``digits`` is then the most shown). Every number on the page goes
through ``fixed``, which never prints a signed zero: -0.0004 at three decimals is "0.000", not "-0.000"
(a sign that says a difference leans one way where it rounds to none).
"""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from model.evaluation.statistics.small_sample import supported_decimals

NO_INTERVAL = "interval not estimable at this size"


def esc(value: Any) -> str:
    """value as HTML text."""
    return html.escape(str(value))


def fixed(value: float, places: int, signed: bool = False) -> str:
    """value with `places` decimals ('+' before a positive one when signed); one that rounds to zero is unsigned."""
    text = f"{value:+.{places}f}" if signed else f"{value:.{places}f}"
    if text.lstrip("+-").strip("0.") == "":  # rounds to zero: no sign either way
        return text.lstrip("+-")
    return text


def num(value: Any, digits: int = 3) -> str:
    """A number for a table cell, 'n/a' for None."""
    if value is None:
        return "n/a"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return fixed(value, digits)


def _degenerate(cell: Mapping[str, Any]) -> bool:
    return cell.get("lower") is not None and cell.get("lower") == cell.get("upper")


def not_estimable(cell: Mapping[str, Any]) -> str:
    """The text of a cell the small-sample rule marks not estimable: the reason, no number."""
    return f"not estimable ({cell.get('reason', 'at this size')})"


def _format(cell: Mapping[str, Any], digits: int, signed: bool):
    """The formatter of a cell's numbers: `digits` at most, fewer where its interval's standard error is wider."""
    places = supported_decimals(cell.get("lower"), cell.get("upper"), digits)
    return lambda v: fixed(v, places, signed)


def ci(cell: Mapping[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """'estimate (lower to upper)' of an {estimate, lower, upper} cell; a zero-width interval is named as such, a
    cell marked not estimable shows only why."""
    if cell and cell.get("estimable") is False:
        return not_estimable(cell)
    if not cell or cell.get("estimate") is None:
        return "n/a" if not cell or not cell.get("reason") else f"n/a ({cell['reason']})"
    if _degenerate(cell):
        return f"{fixed(cell['estimate'], digits, signed)} ({NO_INTERVAL})"
    fmt = _format(cell, digits, signed)
    interval = ("" if cell.get("lower") is None or cell.get("upper") is None
                else f" ({fmt(cell['lower'])} to {fmt(cell['upper'])})")
    return fmt(cell["estimate"]) + interval


def pct(value: Any, digits: int = 1) -> str:
    """A fraction as a percentage, 'n/a' for None."""
    return "n/a" if value is None else f"{100.0 * value:.{digits}f}%"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; the first `left` columns are left-aligned; cells are escaped."""
    head = "".join(f'<th class="l">{esc(h)}</th>' if i < left else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td class="l">{esc(c)}</td>' if i < left else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def section(title: str, item: str, body: str) -> str:
    """A titled page section tagged with its TRIPOD+AI item(s)."""
    tag = f'<span class="item">TRIPOD+AI {esc(item)}</span>' if item else ""
    return f"<section><h2>{esc(title)}{tag}</h2>{body}</section>"


def card(key: str, value: str, interval: str = "", note: str = "", grey: bool = False) -> str:
    """A headline number's card: its name, value, interval and small-sample note (greyed when not estimable)."""
    note_html = f'<div class="ss">{esc(note)}</div>' if note else ""
    return (f'<div class="card{" grey" if grey else ""}"><div class="k">{esc(key)}</div><div class="v">{esc(value)}'
            f'</div><div class="ci">{esc(interval)}</div>{note_html}</div>')


def interval_text(cell: Mapping[str, Any] | None, digits: int = 3, signed: bool = False) -> tuple[str, str]:
    """(estimate, '95% CI lower to upper') of a cell for a card; a zero-width interval is named as such, a cell
    marked not estimable gives no number."""
    if cell and cell.get("estimable") is False:
        return "not estimable", cell.get("reason", "at this size")
    if not cell or cell.get("estimate") is None:
        return "n/a", ""
    if cell.get("lower") is None or _degenerate(cell):
        return fixed(cell["estimate"], digits, signed), "" if cell.get("lower") is None else NO_INTERVAL
    fmt = _format(cell, digits, signed)
    return fmt(cell["estimate"]), f"95% CI {fmt(cell['lower'])} to {fmt(cell['upper'])}"
