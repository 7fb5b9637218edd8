"""The device check's one table: a row per figure or check, with its verdict."""

import dataclasses
import pathlib
import textwrap

PASS, FAIL, INFO = "pass", "FAIL", "-"


@dataclasses.dataclass
class Row:
    section: str
    what: str
    figure: str
    verdict: str = INFO


class Report:
    """Rows in the order they were found; failed when any row failed. With
    `live`, each row is also appended to that file as it is found, so a run
    cut short still leaves every row it made."""

    def __init__(self, title: str, live: pathlib.Path | None = None):
        self.title = title
        self.rows: list[Row] = []
        self.live = live
        if live:
            live.parent.mkdir(parents=True, exist_ok=True)
            live.write_text(title + "\n")

    def add(self, section: str, what: str, figure: str, verdict: str = INFO) -> None:
        self.rows.append(Row(section, what, figure, verdict))
        line = f"[{section}] {what}: {figure} [{verdict}]"
        print(line, flush=True)
        if self.live:
            with open(self.live, "a") as f:
                f.write(line + "\n")

    def check(self, section: str, what: str, figure: str, ok: bool) -> None:
        self.add(section, what, figure, PASS if ok else FAIL)

    def failed(self) -> bool:
        return any(r.verdict == FAIL for r in self.rows)

    def render(self, figure_width: int = 100) -> str:
        head = ("section", "check", "figure", "verdict")
        cells = [head] + [(r.section, r.what, r.figure, r.verdict) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(2)]
        widths.append(min(figure_width, max(len(c[2]) for c in cells)))
        lines = [self.title, ""]
        for i, c in enumerate(cells):
            # A long figure wraps within its column; the verdict stays on the first line.
            parts = textwrap.wrap(c[2], widths[2]) or [""]
            lines.append("  ".join(c[j].ljust(widths[j]) for j in range(2)) + "  "
                         + parts[0].ljust(widths[2]) + "  " + c[3])
            pad = " " * (widths[0] + widths[1] + 4)
            lines += [pad + p for p in parts[1:]]
            if i == 0:
                lines.append("  ".join("-" * w for w in widths) + "  -------")
        failed = sum(r.verdict == FAIL for r in self.rows)
        passed = sum(r.verdict == PASS for r in self.rows)
        lines += ["", f"{passed} passed, {failed} failed"]
        return "\n".join(lines)
