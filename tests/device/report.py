"""The device check's one table: a row per figure or check, with its verdict."""

import dataclasses

PASS, FAIL, INFO = "pass", "FAIL", "-"


@dataclasses.dataclass
class Row:
    section: str
    what: str
    figure: str
    verdict: str = INFO


class Report:
    """Rows in the order they were found; failed when any row failed."""

    def __init__(self, title: str):
        self.title = title
        self.rows: list[Row] = []

    def add(self, section: str, what: str, figure: str, verdict: str = INFO) -> None:
        self.rows.append(Row(section, what, figure, verdict))
        print(f"[{section}] {what}: {figure} [{verdict}]", flush=True)

    def check(self, section: str, what: str, figure: str, ok: bool) -> None:
        self.add(section, what, figure, PASS if ok else FAIL)

    def failed(self) -> bool:
        return any(r.verdict == FAIL for r in self.rows)

    def render(self) -> str:
        head = ("section", "check", "figure", "verdict")
        cells = [head] + [(r.section, r.what, r.figure, r.verdict) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        lines = [self.title, ""]
        for i, c in enumerate(cells):
            lines.append("  ".join(c[j].ljust(widths[j]) for j in range(3)) + "  " + c[3])
            if i == 0:
                lines.append("  ".join("-" * w for w in widths) + "  -------")
        failed = sum(r.verdict == FAIL for r in self.rows)
        passed = sum(r.verdict == PASS for r in self.rows)
        lines += ["", f"{passed} passed, {failed} failed"]
        return "\n".join(lines)
