"""Online statistics of one model version: additive counters, and estimates with intervals.

Everything a version's requests contribute is kept as sums that add across time buckets and
workers (:class:`VersionStats`, stored as one Redis hash per version and bucket), so a window of
any length is the sum of its buckets. From the sums (:func:`summarize`):

- CTR@k: share of requests with a click among the top k by served score; Wilson score interval.
- AUC of the served scores against the clicks, pooled over every impression: from score
  histograms (400 logit bins: binning barely moves the AUC, docs/rollout.md); DeLong's variance,
  computed from the same histograms (ties = one bin).
- GAUC: per-request AUC weighted by the request's item count (requests with a click and a
  non-click); normal interval of the weighted mean, requests as the unit.
- MRR: reciprocal rank of a request's best-ranked click, 0 without one, mean over requests;
  normal interval.
- p99 latency: from a log-spaced histogram (5 % wide bins); distribution-free interval from
  the binomial order statistics.
- Degraded share: degraded replies among all replies routed to the version; Wilson interval.

Differences between two versions (:func:`compare`) use Newcombe's hybrid score interval for
proportions and the normal interval of a difference of independent estimates otherwise (the
versions serve disjoint users).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Z95 = 1.959963984540054  # two-sided 95 %
TOP_K = (1, 5, 10)

# Score histogram: logit-spaced bins over [-10, 10] (scores are probabilities).
SCORE_BINS = 400
_LOGIT_LO, _LOGIT_HI = -10.0, 10.0
# Latency histogram: bin b holds [0.1 ms * 1.05^b, 0.1 ms * 1.05^(b+1)).
LATENCY_BINS = 300
_LAT_BASE_MS, _LAT_RATIO = 0.1, 1.05

SCALARS_INT = ("req", "deg", "imp", "clk", "creq", "h1", "h5", "h10", "gn")
SCALARS_FLOAT = ("rr", "rr2", "gw", "gwa", "gw2", "gw2a", "gw2a2")


def score_bin(score: float) -> int:
    """The histogram bin of a served score (a probability; anything else is clamped)."""
    if not math.isfinite(score):
        return 0 if score < 0 or math.isnan(score) else SCORE_BINS - 1
    p = min(max(score, 1e-12), 1.0 - 1e-12)
    logit = math.log(p / (1.0 - p))
    b = int((logit - _LOGIT_LO) / (_LOGIT_HI - _LOGIT_LO) * SCORE_BINS)
    return min(max(b, 0), SCORE_BINS - 1)


def latency_bin(ms: float) -> int:
    """The latency histogram bin of a reply's latency in milliseconds."""
    if math.isnan(ms) or ms <= _LAT_BASE_MS:
        return 0
    if math.isinf(ms):
        return LATENCY_BINS - 1
    b = int(math.log(ms / _LAT_BASE_MS) / math.log(_LAT_RATIO))
    return min(max(b, 0), LATENCY_BINS - 1)


def latency_edges(b: int) -> tuple[float, float]:
    """``[low, high)`` in ms of latency bin ``b``."""
    return _LAT_BASE_MS * _LAT_RATIO**b, _LAT_BASE_MS * _LAT_RATIO ** (b + 1)


def ranks_by_score(scores: Sequence[float]) -> list[int]:
    """1-based rank of each item by descending score (ties keep the items' order)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    ranks = [0] * len(scores)
    for r, i in enumerate(order, start=1):
        ranks[i] = r
    return ranks


def request_auc(scores: Sequence[float], clicked: Iterable[int]) -> float | None:
    """AUC of one request: share of (clicked, not clicked) pairs ordered right (ties 1/2);
    None when every item or none is clicked."""
    pos = set(clicked)
    n_pos, n_neg = len(pos), len(scores) - len(pos)
    if n_pos == 0 or n_neg == 0:
        return None
    wins = 0.0
    for p in pos:
        sp = scores[p]
        for j, sj in enumerate(scores):
            if j not in pos:
                wins += 1.0 if sp > sj else 0.5 if sp == sj else 0.0
    return wins / (n_pos * n_neg)


@dataclass
class VersionStats:
    """Additive statistics of one version over some requests (one bucket, or a whole window).

    ``pos``/``neg``: impressions per score bin, clicked or not; ``lat``: replies per latency
    bin (scored and degraded). The GAUC sums are over requests with a defined request AUC ``a``
    and weight ``w`` (items): ``gw = Σw, gwa = Σwa, gw2 = Σw², gw2a = Σw²a, gw2a2 = Σw²a²``.
    """

    req: int = 0  # model-scored requests
    deg: int = 0  # degraded replies
    imp: int = 0  # impressions (items of scored requests)
    clk: int = 0  # clicked impressions
    creq: int = 0  # requests with at least one click
    h1: int = 0
    h5: int = 0
    h10: int = 0
    gn: int = 0
    rr: float = 0.0
    rr2: float = 0.0
    gw: float = 0.0
    gwa: float = 0.0
    gw2: float = 0.0
    gw2a: float = 0.0
    gw2a2: float = 0.0
    pos: dict[int, int] = field(default_factory=dict)
    neg: dict[int, int] = field(default_factory=dict)
    lat: dict[int, int] = field(default_factory=dict)

    def hits(self, k: int) -> int:
        return {1: self.h1, 5: self.h5, 10: self.h10}[k]

    def add(self, other: VersionStats) -> None:
        for name in SCALARS_INT + SCALARS_FLOAT:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.pos, other.pos), (self.neg, other.neg), (self.lat, other.lat)):
            for b, n in theirs.items():
                mine[b] = mine.get(b, 0) + n

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> VersionStats:
        """Parse one stats hash as Redis returns it (fields ``p:B``, ``n:B``, ``l:B``, scalars)."""
        out = cls()
        hists = {"p": out.pos, "n": out.neg, "l": out.lat}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            text = value.decode() if isinstance(value, bytes) else value
            kind, sep, rest = name.partition(":")
            if sep and kind in hists:
                count = int(float(text))
                if count:
                    hists[kind][int(rest)] = count
            elif name in SCALARS_INT:
                setattr(out, name, int(float(text)))
            elif name in SCALARS_FLOAT:
                setattr(out, name, float(text))
        return out

    @classmethod
    def total(cls, parts: Iterable[VersionStats]) -> VersionStats:
        out = cls()
        for part in parts:
            out.add(part)
        return out


def stats_of_requests(
    requests: Iterable[tuple[Sequence[float], Iterable[int]]],
) -> VersionStats:
    """The statistics of requests whose clicks are all known: ``(scores, clicked positions)``
    each (0-based). What the join builds up incrementally, computed in one go: the reference
    of the tests and of the offline side of the benchmark."""
    s = VersionStats()
    for scores, clicked_positions in requests:
        clicked = set(clicked_positions)
        ranks = ranks_by_score(scores)
        s.req += 1
        s.imp += len(scores)
        s.clk += len(clicked)
        for i, x in enumerate(scores):
            hist = s.pos if i in clicked else s.neg
            b = score_bin(x)
            hist[b] = hist.get(b, 0) + 1
        if clicked:
            best = min(ranks[i] for i in clicked)
            s.creq += 1
            s.h1 += best <= 1
            s.h5 += best <= 5
            s.h10 += best <= 10
            s.rr += 1 / best
            s.rr2 += 1 / best**2
        a = request_auc(scores, clicked)
        if a is not None:
            w = float(len(scores))
            s.gn += 1
            s.gw += w
            s.gwa += w * a
            s.gw2 += w * w
            s.gw2a += w * w * a
            s.gw2a2 += w * w * a * a
    return s


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with its interval (None where there is no data yet)."""

    value: float | None
    lo: float | None
    hi: float | None
    n: int = 0  # the units behind it (requests, or impressions for AUC positives)

    def to_json(self) -> dict[str, float | int | None]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        return {"value": r(self.value), "lo": r(self.lo), "hi": r(self.hi), "n": self.n}


NONE = Estimate(None, None, None, 0)


def sequential_z(n: int, *, tuned_for: int, alpha: float = 0.05) -> float:
    """The z of a time-uniform interval: an asymptotic confidence sequence (Waudby-Smith et al.,
    "Time-uniform central limit theory and asymptotic confidence sequences", 2021, normal
    mixture): with probability 1 - ``alpha`` the interval ``estimate ± z·se`` holds at every
    ``n`` at once, however often one looks. Tightest near ``n = tuned_for`` (about 3.0 there
    for alpha 0.05, against 1.96 for one look), widening slowly (like √log n) beyond."""
    if n <= 0:
        return math.inf
    rho2 = (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / max(tuned_for, 1)
    t = n * rho2
    return math.sqrt(2 * (t + 1) / t * math.log(math.sqrt(t + 1) / alpha))


def wilson(successes: int, n: int, z: float = Z95) -> Estimate:
    """Wilson score interval of a binomial proportion."""
    if n <= 0:
        return NONE
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def normal(value: float, variance: float, n: int, z: float = Z95) -> Estimate:
    half = z * math.sqrt(max(variance, 0.0))
    return Estimate(value, value - half, value + half, n)


def mean_estimate(total: float, total_sq: float, n: int, z: float = Z95) -> Estimate:
    """Mean of ``n`` values from their sum and sum of squares; normal interval."""
    if n <= 0:
        return NONE
    mean = total / n
    if n == 1:
        return Estimate(mean, None, None, 1)
    sample_var = max(0.0, (total_sq - n * mean * mean) / (n - 1))
    return normal(mean, sample_var / n, n, z)


def weighted_mean_estimate(
    n: int, sw: float, swa: float, sw2: float, sw2a: float, sw2a2: float, z: float = Z95
) -> Estimate:
    """Weighted mean ``Σwa / Σw`` with the linearised (ratio-estimator) variance
    ``n/(n-1) · Σ w²(a - ā)² / (Σw)²``, units independent."""
    if n <= 0 or sw <= 0:
        return NONE
    mean = swa / sw
    if n == 1:
        return Estimate(mean, None, None, 1)
    spread = max(0.0, sw2a2 - 2 * mean * sw2a + mean * mean * sw2)
    return normal(mean, n / (n - 1) * spread / (sw * sw), n, z)


def auc_delong(pos: Mapping[int, int], neg: Mapping[int, int]) -> tuple[float, float] | None:
    """``(AUC, variance)`` from score histograms: DeLong's placements per bin (ties = one bin,
    counted one half). None without both classes."""
    m, n = sum(pos.values()), sum(neg.values())
    if m == 0 or n == 0:
        return None
    bins = sorted(set(pos) | set(neg))
    below = 0  # negatives in lower bins
    above = m  # positives in this and higher bins (updated as we go)
    v10: list[tuple[float, int]] = []
    v01: list[tuple[float, int]] = []
    for b in bins:
        p, q = pos.get(b, 0), neg.get(b, 0)
        above -= p  # positives strictly above b
        if p:
            v10.append(((below + 0.5 * q) / n, p))
        if q:
            v01.append(((above + 0.5 * p) / m, q))
        below += q
    auc = sum(v * c for v, c in v10) / m
    s10 = sum(c * (v - auc) ** 2 for v, c in v10) / (m - 1) if m > 1 else 0.0
    s01 = sum(c * (v - auc) ** 2 for v, c in v01) / (n - 1) if n > 1 else 0.0
    return auc, s10 / m + s01 / n


def quantile_estimate(counts: Mapping[int, int], q: float, z: float = Z95) -> Estimate:
    """Quantile ``q`` of a latency histogram: the upper edge of the bin holding rank ``⌈qN⌉``
    (conservative); interval from the order statistics at ranks ``Nq ∓ z√(Nq(1-q))``."""
    total = sum(counts.values())
    if total <= 0:
        return NONE
    ordered = sorted(counts.items())

    def bin_at(rank: int) -> int:
        acc = 0
        for b, c in ordered:
            acc += c
            if acc >= rank:
                return b
        return ordered[-1][0]

    spread = z * math.sqrt(total * q * (1 - q))
    rank = max(1, math.ceil(q * total))
    lo_rank = max(1, math.floor(total * q - spread))
    hi_rank = min(total, math.ceil(total * q + spread) + 1)
    lo = latency_edges(bin_at(lo_rank))[0]
    hi = latency_edges(bin_at(hi_rank))[1] if hi_rank <= total else None
    return Estimate(latency_edges(bin_at(rank))[1], lo, hi, total)


@dataclass(frozen=True, slots=True)
class Summary:
    """Every online metric of one version over one window."""

    requests: int
    degraded_replies: int
    impressions: int
    clicks: int
    ctr: dict[int, Estimate]  # k -> share of requests with a click in the top k
    auc: Estimate
    auc_variance: float | None
    gauc: Estimate
    mrr: Estimate
    p99_ms: Estimate
    degraded: Estimate  # share of the version's replies that were degraded

    def metric(self, name: str) -> Estimate:
        if name.startswith("ctr"):
            return self.ctr[int(name[3:])]
        return {
            "auc": self.auc,
            "gauc": self.gauc,
            "mrr": self.mrr,
            "p99": self.p99_ms,
            "degraded": self.degraded,
        }[name]

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "degraded_replies": self.degraded_replies,
            "impressions": self.impressions,
            "clicks": self.clicks,
            **{f"ctr{k}": e.to_json() for k, e in self.ctr.items()},
            "auc": self.auc.to_json(),
            "gauc": self.gauc.to_json(),
            "mrr": self.mrr.to_json(),
            "p99_ms": self.p99_ms.to_json(),
            "degraded": self.degraded.to_json(),
        }


def summarize(stats: VersionStats, z: float = Z95) -> Summary:
    """Estimates with intervals of every metric from a version's sums."""
    delong = auc_delong(stats.pos, stats.neg)
    auc = NONE if delong is None else normal(delong[0], delong[1], sum(stats.pos.values()), z)
    return Summary(
        requests=stats.req,
        degraded_replies=stats.deg,
        impressions=stats.imp,
        clicks=stats.clk,
        ctr={k: wilson(stats.hits(k), stats.req, z) for k in TOP_K},
        auc=auc,
        auc_variance=None if delong is None else delong[1],
        gauc=weighted_mean_estimate(
            stats.gn, stats.gw, stats.gwa, stats.gw2, stats.gw2a, stats.gw2a2, z
        ),
        mrr=mean_estimate(stats.rr, stats.rr2, stats.req, z),
        p99_ms=quantile_estimate(stats.lat, 0.99, z),
        degraded=wilson(stats.deg, stats.req + stats.deg, z),
    )


def newcombe(a: Estimate, b: Estimate) -> Estimate:
    """Interval of ``a - b`` for two independent Wilson-interval proportions (Newcombe 1998,
    method 10)."""
    if a.value is None or b.value is None or None in (a.lo, a.hi, b.lo, b.hi):
        return NONE
    assert a.lo is not None and a.hi is not None and b.lo is not None and b.hi is not None
    d = a.value - b.value
    lo = d - math.sqrt((a.value - a.lo) ** 2 + (b.hi - b.value) ** 2)
    hi = d + math.sqrt((a.hi - a.value) ** 2 + (b.value - b.lo) ** 2)
    return Estimate(d, lo, hi, min(a.n, b.n))


def normal_difference(a: Estimate, b: Estimate, z: float = Z95) -> Estimate:
    """Interval of ``a - b`` for independent estimates with normal intervals at the same ``z``."""
    if None in (a.value, b.value, a.lo, a.hi, b.lo, b.hi):
        return NONE
    assert a.value is not None and b.value is not None
    assert a.lo is not None and a.hi is not None and b.lo is not None and b.hi is not None
    se_a, se_b = (a.hi - a.lo) / (2 * z), (b.hi - b.lo) / (2 * z)
    return normal(a.value - b.value, se_a * se_a + se_b * se_b, min(a.n, b.n), z)


PROPORTIONS = frozenset({"ctr1", "ctr5", "ctr10", "degraded"})


def compare(metric: str, new: Summary, old: Summary, z: float = Z95) -> Estimate:
    """``new - old`` for one metric, with its interval."""
    a, b = new.metric(metric), old.metric(metric)
    if metric in PROPORTIONS:
        return newcombe(a, b)
    return normal_difference(a, b, z)
