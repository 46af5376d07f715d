"""Agreement between raters: Cohen's kappa, Fleiss' kappa, Krippendorff's alpha, confusion matrices.

Pure functions on plain sequences, one kernel per formula (``engine/meta.py:agreement``, the judge report and the
judge panels all call these):

* :func:`cohen_kappa` -- two raters on the same rows, unweighted (Cohen 1960) or weighted (Cohen 1968);
* :func:`fleiss_kappa` -- many raters per row, the same category set (Fleiss 1971);
* :func:`krippendorff_alpha` -- many raters, missing ratings allowed, nominal / ordinal / interval data
  (Krippendorff 2011);
* :func:`confusion` and :func:`per_label_precision_recall` -- the table behind the kappas.

Conventions, the same in every function:

* **Missing values** are ``None``, a float NaN (Python or numpy) or pandas' ``NA`` / ``NaT``. A pair with a missing
  side is dropped (two-rater functions); a missing rating is left out of its row (many-rater functions).
* **Undefined statistics are None**, never NaN: no complete pairs, or a chance-agreement term that leaves a zero
  denominator (everyone used one single label). The counts behind every kappa are integers, so "zero" is tested
  exactly, not with a tolerance.
* **Labels** are compared with ``==`` and hashed (so ``1``, ``1.0`` and ``True`` are one label, ``1`` and ``"1"``
  two). Without ``labels=`` the categories are the values seen, sorted when they can be sorted, else in the order
  first seen. With ``labels=``, a value outside them is an error (it would otherwise vanish from the counts).

References:
    Cohen, J. (1960). A coefficient of agreement for nominal scales. Educ. Psychol. Meas. 20(1), 37-46.
    Cohen, J. (1968). Weighted kappa. Psychol. Bull. 70(4), 213-220.
    Fleiss, J. L. (1971). Measuring nominal scale agreement among many raters. Psychol. Bull. 76(5), 378-382.
    Krippendorff, K. (2011). Computing Krippendorff's alpha-reliability. Annenberg School for Communication,
    University of Pennsylvania, https://repository.upenn.edu/asc_papers/43
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Weights",
    "Level",
    "is_missing",
    "complete_pairs",
    "cohen_kappa",
    "kappa_of_confusion",
    "fleiss_kappa",
    "FleissSums",
    "krippendorff_alpha",
    "coincidences",
    "alpha_of_coincidences",
    "confusion",
    "per_label_precision_recall",
]

Weights = Literal["linear", "quadratic"] | None
Level = Literal["nominal", "ordinal", "interval"]
_WEIGHTS = (None, "linear", "quadratic")
_LEVELS = ("nominal", "ordinal", "interval")


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------


def is_missing(value: Any) -> bool:
    """True for ``None``, a float NaN (Python or numpy) and pandas' ``NA``/``NaT`` (recognised without pandas)."""
    if value is None:
        return True
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return math.isnan(float(value))
    return type(value).__name__ in ("NAType", "NaTType")


def _as_list(values: Any, name: str) -> list[Any]:
    if isinstance(values, str | bytes):
        raise TypeError(f"{name} must be a sequence of labels, one per row, not a single string")
    if hasattr(values, "to_numpy"):  # a pandas Series keeps None / NA as they are in an object array
        values = values.to_numpy(dtype=object)
    return list(values.tolist() if hasattr(values, "tolist") else values)


def complete_pairs(a: Iterable[Any], b: Iterable[Any]) -> tuple[list[tuple[Any, Any]], int]:
    """The pairs ``(a[i], b[i])`` where neither side is missing, and how many were dropped.

    Raises:
        ValueError: when the two sequences differ in length.
    """
    a_list, b_list = _as_list(a, "a"), _as_list(b, "b")
    if len(a_list) != len(b_list):
        raise ValueError(f"the two raters' labels must be aligned row by row, got {len(a_list)} and {len(b_list)}")
    pairs = [(x, y) for x, y in zip(a_list, b_list, strict=True) if not (is_missing(x) or is_missing(y))]
    return pairs, len(a_list) - len(pairs)


def _categories(seen: Iterable[Hashable], labels: Iterable[Hashable] | None) -> list[Hashable]:
    """The category list: ``labels`` as given (checked), else the values seen, sorted when sortable."""
    seen_list = list(dict.fromkeys(seen))  # first-seen order, duplicates removed
    if labels is not None:
        cats = _as_list(labels, "labels")
        if len(set(cats)) != len(cats):
            raise ValueError(f"labels {cats!r} lists a label twice; give each category once, in scale order")
        outside = [v for v in seen_list if v not in set(cats)]
        if outside:
            raise ValueError(
                f"the values {outside!r} are not among labels={cats!r}; add them to labels, or map them onto "
                "the scale before computing agreement"
            )
        return cats
    try:
        return sorted(seen_list)  # type: ignore[type-var]
    except TypeError:  # mixed types (e.g. 1 and "yes"): keep the order first seen
        return seen_list


def _weight(i: int, j: int, weights: Weights) -> int:
    """Cohen's (1968) disagreement weight between category ranks i and j, up to a constant factor.

    The factor (1 / (k-1) for linear, 1 / (k-1)^2 for quadratic) cancels in kappa_w's ratio, so integer
    weights keep the arithmetic exact.
    """
    if weights is None:
        return 0 if i == j else 1
    if weights == "linear":
        return abs(i - j)
    return (i - j) ** 2


# ---------------------------------------------------------------------------------------------
# Two raters
# ---------------------------------------------------------------------------------------------


def confusion(
    a: Iterable[Hashable | None], b: Iterable[Hashable | None], labels: Iterable[Hashable] | None = None
) -> tuple[list[Hashable], list[list[int]]]:
    """The confusion matrix of two raters: ``matrix[i][j]`` = rows where ``a`` said ``labels[i]`` and ``b`` said
    ``labels[j]`` (rows of the matrix are ``a``, columns ``b``, as ``sklearn.metrics.confusion_matrix(a, b)``).

    Pairs with a missing side are left out. Empty input gives the labels (``[]`` without ``labels=``) and a
    matrix of zeros.

    Raises:
        ValueError: when the inputs differ in length, or a value is outside ``labels``.
    """
    pairs, _ = complete_pairs(a, b)
    cats = _categories([x for p in pairs for x in p], labels)
    index = {c: i for i, c in enumerate(cats)}
    matrix = [[0] * len(cats) for _ in cats]
    for x, y in pairs:
        matrix[index[x]][index[y]] += 1
    return cats, matrix


def cohen_kappa(
    a: Iterable[Hashable | None],
    b: Iterable[Hashable | None],
    *,
    weights: Weights = None,
    labels: Iterable[Hashable] | None = None,
) -> float | None:
    """Cohen's kappa between two raters on the same rows; weighted for ordered scales.

    With ``O[i][j]`` the share of rows rated ``(labels[i], labels[j])``, ``E[i][j] = O[i][.] * O[.][j]`` the share
    expected by chance from each rater's own label frequencies and ``w[i][j]`` a disagreement weight,

        kappa_w = 1 - sum(w * O) / sum(w * E)          (Cohen 1968)

    With ``weights=None`` (``w = 0`` on the diagonal, 1 elsewhere) this is Cohen's (1960) kappa,
    ``(p_o - p_e) / (1 - p_e)``. ``"linear"`` uses ``w = |i - j|``, ``"quadratic"`` ``w = (i - j)^2``, where
    ``i`` and ``j`` are the *ranks* of the labels in ``labels`` (not their values; sklearn's
    ``cohen_kappa_score`` does the same), so pass the whole scale, e.g. ``labels=[1, 2, 3, 4, 5]``, for the
    distances to count categories nobody used. Quadratic-weighted kappa is close to the intraclass
    correlation of the two raters (Fleiss & Cohen 1973).

    Args:
        a: one rater's labels (e.g. the judge), ``None``/NaN for missing.
        b: the other rater's labels, aligned with ``a``.
        weights: ``None``, ``"linear"`` or ``"quadratic"``.
        labels: the categories in scale order; default the values seen, sorted.

    Returns:
        kappa, or ``None`` when it is undefined: no complete pairs, or ``sum(w * E) == 0`` (both raters used one
        and the same single label, so chance agreement is already perfect).

    Raises:
        ValueError: when the inputs differ in length, ``weights`` is unknown, or a value is outside ``labels``.
    """
    if weights not in _WEIGHTS:
        raise ValueError(f"weights={weights!r} is not one of None, 'linear', 'quadratic'")
    _, matrix = confusion(a, b, labels)
    return kappa_of_confusion(matrix, weights=weights)


def kappa_of_confusion(matrix: Sequence[Sequence[int]], *, weights: Weights = None) -> float | None:
    """Cohen's kappa (:func:`cohen_kappa`) from the two raters' confusion matrix over the categories in scale order
    (:func:`confusion`): the matrices of parts of the data add up, so their sum gives the kappa of the whole."""
    if weights not in _WEIGHTS:
        raise ValueError(f"weights={weights!r} is not one of None, 'linear', 'quadratic'")
    n = sum(map(sum, matrix))
    if n == 0:
        return None
    k = len(matrix)
    rows = [sum(matrix[i]) for i in range(k)]
    cols = [sum(matrix[i][j] for i in range(k)) for j in range(k)]
    # sum(w * O) * n^2 and sum(w * E) * n^2, in integers.
    observed = n * sum(_weight(i, j, weights) * matrix[i][j] for i in range(k) for j in range(k))
    expected = sum(_weight(i, j, weights) * rows[i] * cols[j] for i in range(k) for j in range(k))
    if expected == 0:
        return None
    return 1.0 - observed / expected


def per_label_precision_recall(
    judge: Iterable[Hashable | None],
    human: Iterable[Hashable | None],
    labels: Iterable[Hashable] | None = None,
) -> dict[Hashable, dict[str, Any]]:
    """Precision and recall of each label, with the people's labels as the truth.

    For a label ``c``: ``precision = #(judge = c and human = c) / #(judge = c)`` (of the rows the judge called
    ``c``, the share people called ``c``); ``recall = #(judge = c and human = c) / #(human = c)`` (of the rows
    people called ``c``, the share the judge found). Pairs with a missing side are left out.

    Returns:
        ``{label: {"precision", "recall", "support", "predicted", "correct"}}`` in ``labels`` order, where
        ``support`` = #(human = c), ``predicted`` = #(judge = c), ``correct`` the diagonal count; ``precision``
        is ``None`` when the judge never said ``c``, ``recall`` ``None`` when people never did.

    Raises:
        ValueError: when the inputs differ in length, or a value is outside ``labels``.
    """
    cats, matrix = confusion(judge, human, labels)
    out: dict[Hashable, dict[str, Any]] = {}
    for i, c in enumerate(cats):
        correct = matrix[i][i]
        predicted = sum(matrix[i])
        support = sum(row[i] for row in matrix)
        out[c] = {
            "precision": correct / predicted if predicted else None,
            "recall": correct / support if support else None,
            "support": support,
            "predicted": predicted,
            "correct": correct,
        }
    return out


# ---------------------------------------------------------------------------------------------
# Many raters
# ---------------------------------------------------------------------------------------------


def _units(ratings: Any) -> list[list[Hashable]]:
    """Each unit's (row's) ratings with the missing ones left out."""
    if isinstance(ratings, str | bytes):
        raise TypeError("ratings must be a table (units x raters), not a string")
    if hasattr(ratings, "to_numpy"):  # a DataFrame: its rows are the units
        ratings = ratings.to_numpy(dtype=object)
    rows = ratings.tolist() if hasattr(ratings, "tolist") else list(ratings)
    units: list[list[Hashable]] = []
    for u, row in enumerate(rows):
        if isinstance(row, str | bytes) or not isinstance(row, Iterable):
            raise TypeError(
                f"ratings[{u}] is {row!r}; ratings must be a table with one row per unit (e.g. per question) and "
                "one column per rater (or per draw), e.g. [['yes', 'yes', 'no'], ['no', 'no', None]]"
            )
        units.append([v for v in row if not is_missing(v)])
    return units


def fleiss_kappa(ratings: Sequence[Sequence[Hashable | None]] | Any) -> float | None:
    """Fleiss' kappa for many raters (or repeated draws) per unit, nominal categories.

    ``ratings`` is units x raters: ``ratings[u]`` holds unit ``u``'s ratings (``None``/NaN = missing). Missing
    ratings are left out, then units with fewer than 2 ratings are dropped. With ``n_u`` ratings of unit ``u``,
    ``n_uj`` of them in category ``j``, and ``N`` units left:

        P_u   = sum_j n_uj (n_uj - 1) / (n_u (n_u - 1))     agreement within unit u
        P_bar = mean_u P_u
        p_j   = sum_u n_uj / sum_u n_u                       share of all ratings in category j
        P_e   = sum_j p_j^2
        kappa = (P_bar - P_e) / (1 - P_e)

    When every unit has the same number of ratings this is exactly Fleiss' (1971) kappa (what
    ``statsmodels.stats.inter_rater.fleiss_kappa`` computes). Fleiss' formula assumes that number is constant;
    when missing ratings leave units with different ``n_u``, this function does not drop ratings to force it:
    it keeps each unit's own ``P_u`` (with its own ``n_u``) and pools the category shares over all ratings, the
    direct extension of the same formula. It is *not* Conger's (1980) or Randolph's (2005) variant. For
    ratings with many missing values, :func:`krippendorff_alpha` (nominal) is the statistic designed for it.

    Returns:
        kappa, or ``None`` when undefined: no unit with 2 or more ratings, or a single category used by
        everyone (``P_e = 1``).

    Raises:
        TypeError: when ``ratings`` is not a table of rows.
    """
    return FleissSums.of(ratings).kappa()


@dataclass(frozen=True)
class FleissSums:
    """What :func:`fleiss_kappa` is computed from (:meth:`kappa`): the units with 2 or more ratings, the sum of their
    ``P_u`` and every category's count of ratings. Sums of parts of the data merge (:meth:`merge`) into the sums
    of the whole."""

    units: int = 0
    agreement: float = 0.0
    totals: tuple[tuple[Hashable, int], ...] = ()

    @classmethod
    def of(cls, ratings: Sequence[Sequence[Hashable | None]] | Any) -> FleissSums:
        totals: Counter[Hashable] = Counter()
        units, p_sum = 0, 0.0
        for unit in _units(ratings):
            if len(unit) < 2:
                continue
            counts = Counter(unit)
            totals.update(counts)
            m = len(unit)
            p_sum += sum(c * (c - 1) for c in counts.values()) / (m * (m - 1))
            units += 1
        return cls(units, p_sum, tuple(totals.items()))

    def merge(self, other: FleissSums) -> FleissSums:
        totals = Counter(dict(self.totals))
        totals.update(dict(other.totals))
        return FleissSums(self.units + other.units, self.agreement + other.agreement, tuple(totals.items()))

    def kappa(self) -> float | None:
        """Fleiss' kappa from the sums (formula: :func:`fleiss_kappa`); None when undefined."""
        counts = [c for _, c in self.totals if c]
        if not self.units or len(counts) < 2:
            return None
        n_ratings = sum(counts)
        p_e = sum((c / n_ratings) ** 2 for c in counts)
        return (self.agreement / self.units - p_e) / (1.0 - p_e)


def _delta2(level: Level, values: list[Hashable], margins: list[float]) -> list[list[float]]:
    """Krippendorff's squared difference ``delta^2(c, k)`` between every two values (2011, section C)."""
    k = len(values)
    if level == "nominal":
        return [[0.0 if i == j else 1.0 for j in range(k)] for i in range(k)]
    if level == "interval":
        nums = [float(v) for v in values]  # type: ignore[arg-type]
        return [[(nums[i] - nums[j]) ** 2 for j in range(k)] for i in range(k)]
    # ordinal: (sum of the margins from c to k, minus half of the two ends' margins)^2, values in rank order
    cum = [0.0]
    for m in margins:
        cum.append(cum[-1] + m)
    out = [[0.0] * k for _ in range(k)]
    for i in range(k):
        for j in range(i + 1, k):
            d = cum[j + 1] - cum[i] - (margins[i] + margins[j]) / 2.0
            out[i][j] = out[j][i] = d * d
    return out


def krippendorff_alpha(ratings: Sequence[Sequence[Hashable | None]] | Any, *, level: Level = "nominal") -> float | None:
    """Krippendorff's alpha for many raters with missing ratings, from the coincidence matrix (Krippendorff 2011).

    ``ratings`` is units x raters (the ``krippendorff`` package takes the transpose, raters x units); ``None``/NaN
    is a missing rating. Only units with 2 or more ratings are pairable. Each such unit ``u`` with ``m_u`` ratings
    adds ``1 / (m_u - 1)`` to ``o[c][k]`` for every ordered pair of its ratings (different raters) valued
    ``(c, k)``. With ``n_c = sum_k o[c][k]`` and ``n = sum_c n_c`` (the pairable ratings):

        D_o   = sum_{c,k} o[c][k] delta^2(c, k) / n                     observed disagreement
        D_e   = sum_{c,k} n_c n_k delta^2(c, k) / (n (n - 1))           disagreement expected by chance
        alpha = 1 - D_o / D_e

    ``delta^2`` by ``level``: nominal ``0`` if ``c == k`` else ``1``; interval ``(c - k)^2``; ordinal
    ``(sum_{g=c..k} n_g - (n_c + n_k) / 2)^2`` over the values in sorted order.

    Returns:
        alpha, or ``None`` when undefined: no pairable unit, or ``D_e = 0`` (a single value in all pairable
        ratings).

    Raises:
        ValueError: for an unknown ``level``.
        TypeError: for interval data that are not numbers, or ordinal values that cannot be sorted.
    """
    if level not in _LEVELS:
        raise ValueError(f"level={level!r} is not one of {', '.join(_LEVELS)}")
    return alpha_of_coincidences(coincidences(ratings), level=level)


def coincidences(ratings: Sequence[Sequence[Hashable | None]] | Any) -> dict[tuple[Hashable, Hashable], float]:
    """Krippendorff's coincidence matrix of the ratings (units x raters), as ``{(c, k): o[c][k]}`` over the pairs of
    values that occur: each unit with ``m_u >= 2`` ratings adds ``1 / (m_u - 1)`` for every ordered pair of its
    ratings by different raters. The matrices of parts of the data add up to the whole's."""
    o: dict[tuple[Hashable, Hashable], float] = {}
    for unit in _units(ratings):
        if len(unit) < 2:
            continue
        counts = Counter(unit)
        share = 1.0 / (len(unit) - 1)
        for c, nc in counts.items():
            for d, nd in counts.items():
                # ordered pairs of different raters: nc * nd, less the nc self-pairs on the diagonal
                pairs = nc * nd - (nc if c == d else 0)
                if pairs:
                    o[(c, d)] = o.get((c, d), 0.0) + pairs * share
    return o


def alpha_of_coincidences(o: dict[tuple[Hashable, Hashable], float], *, level: Level = "nominal") -> float | None:
    """Krippendorff's alpha (:func:`krippendorff_alpha`) from a coincidence matrix (:func:`coincidences`)."""
    if level not in _LEVELS:
        raise ValueError(f"level={level!r} is not one of {', '.join(_LEVELS)}")
    values = list(dict.fromkeys(v for pair in o for v in pair))
    if level == "interval":
        bad = [v for v in values if not isinstance(v, numbers.Real)]
        if bad:
            raise TypeError(f"level='interval' needs numbers; got {bad[0]!r}. Map the labels to numbers first")
    if level == "ordinal":
        try:
            values = sorted(values)  # type: ignore[type-var]
        except TypeError as exc:
            raise TypeError(
                f"level='ordinal' needs values that sort in scale order; {values!r} do not. Map them to their "
                "rank on the scale (e.g. 'low' -> 1, 'high' -> 3) first"
            ) from exc
    index = {v: i for i, v in enumerate(values)}
    k = len(values)
    matrix = [[0.0] * k for _ in range(k)]
    for (c, d), w in o.items():
        matrix[index[c]][index[d]] += w
    margins = [sum(row) for row in matrix]
    n = sum(margins)
    if n == 0:
        return None
    delta2 = _delta2(level, values, margins)
    observed = sum(matrix[c][d] * delta2[c][d] for c in range(k) for d in range(k))
    expected = sum(margins[c] * margins[d] * delta2[c][d] for c in range(k) for d in range(k))
    if expected == 0:
        return None
    return 1.0 - (n - 1) * observed / expected
