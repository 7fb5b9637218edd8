"""How far two greedy runs agree: the tokens, step by step, until the first
near-tie, and the top log-probabilities of the steps they share.

A run is a list of steps `(token, top)`: the token chosen and {token:
log-probability} for the tokens whose log-probabilities are known (a server's
top 5; every token, for the reference)."""

import dataclasses


@dataclasses.dataclass
class Agreement:
    steps: int  # steps compared
    equal: int  # leading steps with the same token
    first_diff: str  # "" when all are equal, else what happened there
    tie: bool  # the first difference was a near-tie of the expected run
    max_lp_diff: float  # over the equal steps' shared top tokens
    first_step_lp_diff: float  # the first step's alone

    def ok(self, lp_tol: float) -> bool:
        diverged = self.first_diff and not self.tie
        return not diverged and self.max_lp_diff <= lp_tol

    def figure(self) -> str:
        if not self.first_diff:
            tokens = f"{self.equal}/{self.steps} tokens equal"
        else:
            tokens = f"{self.equal}/{self.steps} equal, then {self.first_diff}"
        return (f"{tokens}; max |dlogprob| {self.max_lp_diff:.4f} "
                f"(step 0 top-5: {self.first_step_lp_diff:.4f})")


def server_steps(response: dict, ids: dict) -> list:
    """Steps from a /v1/completions response with `logprobs`, token strings
    mapped back to ids through the vocabulary `ids`."""
    lp = response["choices"][0]["logprobs"]
    steps = []
    for token, top in zip(lp["tokens"], lp["top_logprobs"]):
        steps.append((ids[token], {ids[t]: float(v) for t, v in top.items()}))
    return steps


def _shared_diff(expected, got: dict) -> float:
    return max((abs(expected[t] - v) for t, v in got.items() if t in expected), default=0.0)


def compare(expected: list, got: list, tie_tol: float) -> Agreement:
    """`got` against `expected`; a difference is a near-tie when `expected`
    rated `got`'s token within `tie_tol` of its own."""
    equal, first_diff, tie, max_diff = 0, "", False, 0.0
    for i, ((e_tok, e_top), (g_tok, g_top)) in enumerate(zip(expected, got)):
        if e_tok != g_tok:
            gap = e_top[e_tok] - e_top[g_tok] if g_tok in e_top else None
            tie = gap is not None and gap <= tie_tol
            gap_text = f"gap {gap:.4f}" if gap is not None else "not in the expected top"
            first_diff = f"{'near-tie' if tie else 'DIVERGED'} at step {i} ({gap_text})"
            break
        equal += 1
        max_diff = max(max_diff, _shared_diff(e_top, g_top))
    first = _shared_diff(expected[0][1], got[0][1]) if expected and got else 0.0
    if len(expected) != len(got) and not first_diff:
        first_diff = f"DIVERGED: {len(got)} steps against {len(expected)}"
    return Agreement(min(len(expected), len(got)), equal, first_diff, tie, max_diff, first)


class Every:
    """Every token's log-probability (the reference's), looked up as a dict."""

    def __init__(self, values: list):
        self.values = values

    def __contains__(self, token: int) -> bool:
        return 0 <= token < len(self.values)

    def __getitem__(self, token: int) -> float:
        return self.values[token]


def reference_steps(greedy: list) -> list:
    """Steps from the reference's [(token, log_probs tensor)]."""
    return [(token, Every(lp.tolist())) for token, lp in greedy]
