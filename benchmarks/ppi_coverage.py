"""Coverage of the human-calibrated intervals (PPI++, PPI, labels only) on public human-labelled data.

Each study takes a data set where every row has both a judge score and a human label, treats the human mean over
**all** rows as the truth, and then, many times over, labels a uniform random sample of ``n`` rows (without
replacement), hides the other labels, and asks :func:`mlflow_ragjudge.engine.ppi.ppi_mean` (or
:func:`~mlflow_ragjudge.engine.ppi.ppi_paired_diff`) for a 95 % interval. It reports how often each interval covers the
truth, how wide it is, the bias and spread of the point estimates, and the judge-only mean's bias::

    .venv/bin/python benchmarks/ppi_coverage.py --data ../shared/data              # ~35 s, Markdown on stdout
    .venv/bin/python benchmarks/ppi_coverage.py --data ../shared/data --out ppi_coverage.json

Studies (docs/calibration.md, "Measured on public data", quotes the output):

* ``nq301_gpt4`` -- OpenQA-eval NQ301, 1,490 answers: judge = GPT-4's recorded verdict (Yes 1, No 0; a reply
  starting with neither counts as No, as :mod:`tools.offline_judge.fit` does), human = the majority's
  acceptable (1) or not (0).
* ``nq301_offline`` / ``nq301_offline_heldout`` -- the same rows judged by ``offline:/lexical``: accepted when its
  correctness level is 4 or 5, rejected at levels 1-3 and when it abstains (level 0), as the offline judge's
  NQ301 meta-evaluation counts it. The offline judge was fitted on one half of NQ301 (by question), so the study
  is run on all rows and on the held-out half alone (the truth then being the held-out half's human mean).
* ``mtrag_rl_f`` / ``mtrag_rl_f_models`` -- MTRAG, all 477 responses / the 318 model responses: judge = the
  recorded RAGAS faithfulness ``rl_f`` (0..1), human = mean human faithfulness put on 0..1 as ``(mean - 1) / 3``.
* paired differences -- two systems scored on the same questions/tasks, labelled per question/task (both answers):
  MTRAG GPT-4o vs Llama-3.1-405B (``rl_f``), and, when OpenQA-eval's per-system outputs are available
  (``--openqa-outputs``, default ``<data>/openqa_eval/model_outputs`` when it exists: the ``data/model_outputs``
  folder of ehsk/OpenQA-eval @ 8b9317d0), for each of GPT-4 and the offline judge the pair of NQ301 systems whose
  judge difference has the opposite sign to the human difference, the largest human difference among such pairs.
  NQ301's TSV files list each distinct answer once, without the system; a system's answer is found by its text.

Every estimate comes from the package's own ``ppi_mean`` / ``ppi_paired_diff`` (the classical interval is the one
they report beside the calibrated one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import string
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools/ (the public data's readers) is beside the package, not installed with it
ALPHA = 0.05


# --------------------------------------------------------------------------- the simulation


def _draws(rng: np.random.Generator, rows: int, n: int, draws: int) -> np.ndarray:
    """``draws`` uniform samples of ``n`` of ``rows`` row indices, without replacement within a draw."""
    return np.argsort(rng.random((draws, rows)), axis=1)[:, :n]


def _summary(est: np.ndarray, lo: np.ndarray, hi: np.ndarray, se: np.ndarray, truth: float) -> dict[str, float]:
    cover = (lo <= truth) & (truth <= hi)
    return {"coverage": float(cover.mean()), "width": float(np.mean(hi - lo)), "bias": float(est.mean() - truth),
            "sd": float(est.std(ddof=1)), "mean_se": float(se.mean()),
            "below": float(np.mean(hi < truth)), "above": float(np.mean(lo > truth)),
            "excludes_zero_right": float(np.mean(lo > 0) if truth > 0 else np.mean(hi < 0) if truth < 0 else 0.0),
            "excludes_zero_wrong": float(np.mean(hi < 0) if truth > 0 else np.mean(lo > 0) if truth < 0 else
                                         np.mean((lo > 0) | (hi < 0)))}


def study(judge: np.ndarray, human: np.ndarray, ns: list[int], draws: int, rng: np.random.Generator,
          judge_b: np.ndarray | None = None, human_b: np.ndarray | None = None) -> dict[str, Any]:
    """Coverage of PPI++ (lam=None), PPI (lam=1) and the classical interval over ``draws`` label draws per ``n``.

    With ``judge_b`` / ``human_b`` the estimand is the paired mean difference ``a - b`` (ppi_paired_diff)."""
    from mlflow_ragjudge.engine.ppi import ppi_mean, ppi_paired_diff

    paired = judge_b is not None
    rows = len(judge)
    h_all = human - human_b if paired else human
    j_all = judge - judge_b if paired else judge
    truth = float(np.mean(h_all))
    out: dict[str, Any] = {"rows": rows, "truth_human_mean": truth, "judge_mean": float(np.mean(j_all)),
                           "judge_bias": float(np.mean(j_all) - truth), "alpha": ALPHA, "draws": draws, "by_n": {}}
    if paired:
        out.update(human_a=float(np.mean(human)), human_b=float(np.mean(human_b)), judge_a=float(np.mean(judge)),
                   judge_b=float(np.mean(judge_b)))
    for n in ns:
        if n >= rows:
            continue
        idx = _draws(rng, rows, n, draws)
        rec: dict[str, list[float]] = {k: [] for k in ("pp_m", "pp_lo", "pp_hi", "pp_se", "pp_lam", "pp_eff",
                                                        "p1_m", "p1_lo", "p1_hi", "p1_se", "p1_eff",
                                                        "c_m", "c_lo", "c_hi", "c_se")}
        for sel in idx:
            ha = np.full(rows, np.nan)
            ha[sel] = human[sel]
            if paired:
                hb = np.full(rows, np.nan)
                hb[sel] = human_b[sel]  # type: ignore[index]
                pp = ppi_paired_diff(judge, judge_b, ha, hb, alpha=ALPHA, lam=None)  # type: ignore[arg-type]
                p1 = ppi_paired_diff(judge, judge_b, ha, hb, alpha=ALPHA, lam=1)  # type: ignore[arg-type]
            else:
                pp = ppi_mean(judge, ha, alpha=ALPHA, lam=None)
                p1 = ppi_mean(judge, ha, alpha=ALPHA, lam=1)
            for key, e in (("pp", pp), ("p1", p1)):
                rec[f"{key}_m"].append(e.mean)
                rec[f"{key}_lo"].append(e.ci_low)
                rec[f"{key}_hi"].append(e.ci_high)
                rec[f"{key}_se"].append(e.se)
                rec[f"{key}_eff"].append(np.nan if e.effective_labels is None else e.effective_labels)
            rec["pp_lam"].append(pp.lam)
            rec["c_m"].append(pp.classical_mean)
            rec["c_lo"].append(pp.classical_ci_low)
            rec["c_hi"].append(pp.classical_ci_high)
            rec["c_se"].append(pp.classical_se)
        a = {k: np.asarray(v, dtype=float) for k, v in rec.items()}
        out["by_n"][str(n)] = {
            "ppi++": {**_summary(a["pp_m"], a["pp_lo"], a["pp_hi"], a["pp_se"], truth),
                      "lam_mean": float(a["pp_lam"].mean()), "effective_labels": float(np.nanmean(a["pp_eff"]))},
            "ppi": {**_summary(a["p1_m"], a["p1_lo"], a["p1_hi"], a["p1_se"], truth),
                    "effective_labels": float(np.nanmean(a["p1_eff"]))},
            "classical": _summary(a["c_m"], a["c_lo"], a["c_hi"], a["c_se"], truth),
        }
    return out


# --------------------------------------------------------------------------- the data


def _nq301(data: Path) -> Any:
    from mlflow_ragjudge.metrics.offline import OfflineJudge
    from tools.offline_judge.fit import SPLIT_SALT
    from tools.offline_judge.public_data import half_split, load_nq301

    nq = load_nq301(data)
    judge = OfflineJudge()
    levels = []
    for r in nq.itertuples():  # scored once; abstained (level 0) or failed counts as not accepted
        res = judge.correctness(r.question, r.answer, list(r.references))
        levels.append(res.value if res.is_scored and res.value is not None else 0)
    nq["offline_level"] = levels
    nq["offline_accept"] = nq["offline_level"] >= 4
    nq["gpt4_accept"] = nq["gpt4"].map(bool)  # unparsed (None) = No, as tools/offline_judge/fit.py does
    nq["fit_half"] = nq["question_id"].isin(half_split(nq["question_id"], SPLIT_SALT))
    return nq


def _norm_exact(s: str) -> str:
    return " ".join(s.strip().lower().split())


def _norm_loose(s: str) -> str:
    s = "".join(" " if c in string.punctuation else c for c in s.lower())
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(t.lstrip("0") or "0" for t in s.split())


def nq_systems(nq: Any, outputs: Path) -> dict[str, np.ndarray]:
    """Per OpenQA-eval system, the NQ301 row index of its answer to each of the 301 questions (-1: not found).

    The TSVs hold each distinct answer once; a system's prediction is matched to its question's rows by text
    (case and spacing ignored; then also punctuation, articles and leading zeros; a list prediction as its
    items joined or any item)."""
    qorder = {q: i for i, q in enumerate(dict.fromkeys(nq["question"]))}
    exact: dict[tuple[str, str], int] = {}
    loose: dict[tuple[str, str], int] = {}
    for i, (q, a) in enumerate(zip(nq["question"], nq["answer"])):
        exact.setdefault((q, _norm_exact(a)), i)
        loose.setdefault((q, _norm_loose(a)), i)
    systems: dict[str, np.ndarray] = {}
    for f in sorted(outputs.glob("*.jsonl")):
        name = re.sub(r"^NQ(301)?_", "", f.stem)
        idx = np.full(len(qorder), -1)
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            q = r["question"]
            if q not in qorder:
                continue
            p = r["prediction"]
            cands = [" | ".join(p), ", ".join(p), *p] if isinstance(p, list) else [p]
            for c in cands:
                hit = exact.get((q, _norm_exact(c)), loose.get((q, _norm_loose(c))))
                if hit is not None:
                    idx[qorder[q]] = hit
                    break
        systems[name] = idx
    return systems


def disagreeing_pair(systems: dict[str, np.ndarray], human: np.ndarray, judge: np.ndarray) -> dict[str, Any]:
    """The pair of systems (on the questions both answered with a found row) whose judge difference has the
    opposite sign to the human difference, with the largest |human difference|; if none, the pair with the
    largest |judge difference - human difference|."""
    pairs = []
    for a, b in itertools.combinations(sorted(systems), 2):
        ok = (systems[a] >= 0) & (systems[b] >= 0)
        ia, ib = systems[a][ok], systems[b][ok]
        hd, jd = float(human[ia].mean() - human[ib].mean()), float(judge[ia].mean() - judge[ib].mean())
        if hd < 0:  # orient so that the humans prefer a
            a, b, ia, ib, hd, jd = b, a, ib, ia, -hd, -jd
        pairs.append({"a": a, "b": b, "questions": int(ok.sum()), "human_diff": hd, "judge_diff": jd,
                      "ia": ia, "ib": ib})
    disagree = [p for p in pairs if p["human_diff"] > 0 and p["judge_diff"] < 0]
    if disagree:
        best = max(disagree, key=lambda p: p["human_diff"])
        return {**best, "rule": "judge and humans rank the pair oppositely; largest human difference",
                "disagreeing_pairs": len(disagree), "pairs": len(pairs)}
    best = max(pairs, key=lambda p: abs(p["judge_diff"] - p["human_diff"]))
    return {**best, "rule": "no pair ranked oppositely; largest judge bias in the difference",
            "disagreeing_pairs": 0, "pairs": len(pairs)}


# --------------------------------------------------------------------------- the report


def _table(res: dict[str, Any], paired: bool = False) -> list[str]:
    """One row per n. "SD / se": the spread of the point estimates over the draws divided by the mean standard
    error the interval used (1: the interval's width is right for this estimand; below 1: wider than needed)."""
    lines = ["| n | coverage PPI++ | PPI | labels only | mean width PPI++ | PPI | labels only | mean λ (PPI++) "
             "| effective labels PPI++ / PPI | bias PPI++ | SD / se PPI++ / labels only |"
             + (" excludes 0, right side: PPI++ / PPI / labels only | wrong side: PPI++ / PPI / labels only |"
                if paired else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if paired else "")]
    for n, r in res["by_n"].items():
        pp, p1, c = r["ppi++"], r["ppi"], r["classical"]
        line = (f"| {n} | {pp['coverage']:.3f} | {p1['coverage']:.3f} | {c['coverage']:.3f} | {pp['width']:.3f} | "
                f"{p1['width']:.3f} | {c['width']:.3f} | {pp['lam_mean']:.2f} | {pp['effective_labels']:.0f} / "
                f"{p1['effective_labels']:.0f} | {pp['bias']:+.4f} | {pp['sd'] / pp['mean_se']:.2f} / "
                f"{c['sd'] / c['mean_se']:.2f} |")
        if paired:
            line += (f" {pp['excludes_zero_right']:.3f} / {p1['excludes_zero_right']:.3f} / "
                     f"{c['excludes_zero_right']:.3f} | {pp['excludes_zero_wrong']:.3f} / "
                     f"{p1['excludes_zero_wrong']:.3f} / {c['excludes_zero_wrong']:.3f} |")
        lines.append(line)
    return lines


def _head(title: str, res: dict[str, Any], extra: str = "") -> list[str]:
    return ["", f"### {title}", "",
            f"{res['rows']} rows; truth (human mean, all rows) {res['truth_human_mean']:.4f}; judge-only mean "
            f"{res['judge_mean']:.4f} (bias {res['judge_bias']:+.4f}, no interval); {res['draws']} draws per n; "
            f"95 % intervals.{extra}", ""]


def report(results: dict[str, Any]) -> str:
    draws = results["meta"]["draws"]
    mc = 1.96 * (0.95 * 0.05 / draws) ** 0.5
    lines = [f"PPI coverage study: {draws} uniform label draws per n, seed {results['meta']['seed']}; a coverage "
             f"of 0.95 is measured to about ±{mc:.3f} (95 % Monte Carlo band). "
             f"Runtime {results['meta']['seconds']:.0f} s."]
    s = results["studies"]
    titles = {"nq301_gpt4": "NQ301, judge = GPT-4 (recorded verdicts)",
              "nq301_offline": "NQ301, judge = offline:/lexical (level ≥ 4 = acceptable), all rows",
              "nq301_offline_heldout": "NQ301, judge = offline:/lexical, held-out half only",
              "mtrag_rl_f": "MTRAG faithfulness, judge = rl_f (RAGAS), human (mean−1)/3, all 477 responses",
              "mtrag_rl_f_models": "MTRAG faithfulness, judge = rl_f, the 318 model responses"}
    for key, title in titles.items():
        if key in s:
            extra = ""
            if "gpt4_unparsed_as_no" in s[key]:
                extra = (" GPT-4 replies starting with neither Yes nor No (counted as No): "
                         f"{s[key]['gpt4_unparsed_as_no']}.")
            if "offline_abstained" in s[key]:
                extra = f" Offline judge abstained (counted as not acceptable) on {s[key]['offline_abstained']} rows."
            if "rl_f_missing" in s[key]:
                extra = f" Rows with rl_f missing (left out): {s[key]['rl_f_missing']}."
            lines += _head(title, s[key], extra) + _table(s[key])
    for key, res in results.get("paired", {}).items():
        extra = (f" Human means a {res['human_a']:.4f}, b {res['human_b']:.4f}; judge means a {res['judge_a']:.4f}, "
                 f"b {res['judge_b']:.4f}.")
        if "pair" in res:
            p = res["pair"]
            extra += (f" Pair rule: {p['rule']} ({p['disagreeing_pairs']} of {p['pairs']} pairs ranked oppositely "
                      "by this judge).")
        lines += _head(f"Paired difference: {key}", res, extra) + _table(res, paired=True)
    if results.get("notes"):
        lines += ["", *[f"Note: {n}" for n in results["notes"]]]
    return "\n".join(lines)


def _default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", help="folder laid out like ../shared/data "
                    "(openqa_eval/, mtrag/)")
    ap.add_argument("--draws", type=int, default=500, help="random label draws per n (default 500)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write every figure as JSON to this file")
    ap.add_argument("--openqa-outputs", help="OpenQA-eval's data/model_outputs folder (per-system NQ answers), for "
                    "the NQ301 paired study; default <data>/openqa_eval/model_outputs when it exists")
    args = ap.parse_args(argv)
    data = Path(args.data)
    missing = [p for p in ("openqa_eval/NQ301_human.tsv", "openqa_eval/NQ301_gpt-4.tsv",
                           "mtrag/reference_subset_with_human_evaluations.json") if not (data / p).is_file()]
    if missing:
        print(f"error: the public reference data is not at {data} (missing: {', '.join(missing)}). This study needs "
              "OpenQA-eval NQ301 (ehsk/OpenQA-eval) and MTRAG (IBM/mt-rag-benchmark) laid out as ../shared/data "
              "is; see tools/offline_judge/public_data.py. Pass --data DIR.", file=sys.stderr)
        return 2
    if args.draws < 2:
        ap.error("--draws must be at least 2")

    from tools.offline_judge.public_data import load_mtrag

    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    studies: dict[str, Any] = {}
    paired: dict[str, Any] = {}
    notes: list[str] = []

    nq = _nq301(data)
    human = nq["human"].to_numpy(float)
    gpt4 = nq["gpt4_accept"].to_numpy(float)
    off = nq["offline_accept"].to_numpy(float)
    ns_nq = [50, 100, 150, 300]
    studies["nq301_gpt4"] = {**study(gpt4, human, ns_nq, args.draws, rng),
                             "gpt4_unparsed_as_no": int(nq["gpt4"].isna().sum())}
    abst = int((nq["offline_level"] == 0).sum())
    studies["nq301_offline"] = {**study(off, human, ns_nq, args.draws, rng), "offline_abstained": abst}
    ho = ~nq["fit_half"].to_numpy()
    studies["nq301_offline_heldout"] = {**study(off[ho], human[ho], ns_nq, args.draws, rng),
                                        "offline_abstained": int((nq["offline_level"][ho] == 0).sum())}

    for key, with_ref in (("mtrag_rl_f", True), ("mtrag_rl_f_models", False)):
        m = load_mtrag(data, include_reference_responder=with_ref)
        ok = m["rl_f"].notna().to_numpy()
        h01 = ((m["faithfulness"] - 1) / 3).to_numpy(float)
        studies[key] = {**study(m["rl_f"].to_numpy(float)[ok], h01[ok], [30, 60, 100], args.draws, rng),
                        "rl_f_missing": int((~ok).sum()), "human_scale": "(mean faithfulness - 1) / 3"}

    # paired: MTRAG's two model responders on the same tasks
    m = load_mtrag(data)
    wide = m.assign(h=(m["faithfulness"] - 1) / 3).pivot(index="task_id", columns="model", values=["rl_f", "h"])
    wide = wide.dropna()
    a, b = "gpt-4o", "llama-3.1-405b-instruct"
    paired[f"MTRAG {a} − {b} (judge rl_f, human faithfulness on 0..1, per task)"] = study(
        wide[("rl_f", a)].to_numpy(float), wide[("h", a)].to_numpy(float), [50, 100], args.draws, rng,
        judge_b=wide[("rl_f", b)].to_numpy(float), human_b=wide[("h", b)].to_numpy(float))

    outputs = Path(args.openqa_outputs) if args.openqa_outputs else data / "openqa_eval" / "model_outputs"
    if outputs.is_dir() and any(outputs.glob("*.jsonl")):
        systems = nq_systems(nq, outputs)
        found = {k: int((v >= 0).sum()) for k, v in systems.items()}
        notes.append("NQ301 answers found per system (of 301 questions): "
                     + ", ".join(f"{k} {v}" for k, v in found.items()) + ".")
        for jname, jvec in (("GPT-4", gpt4), ("offline:/lexical", off)):
            p = disagreeing_pair(systems, human, jvec)
            res = study(jvec[p["ia"]], human[p["ia"]], [50, 100], args.draws, rng,
                        judge_b=jvec[p["ib"]], human_b=human[p["ib"]])
            res["pair"] = {k: v for k, v in p.items() if k not in ("ia", "ib")}
            paired[f"NQ301 {p['a']} − {p['b']} (judge {jname}, per question)"] = res
    else:
        notes.append(f"NQ301 paired study skipped: no per-system outputs at {outputs} (the NQ301 TSVs do not say "
                     "which system gave an answer; pass --openqa-outputs with ehsk/OpenQA-eval's data/model_outputs).")

    results = {"meta": {"draws": args.draws, "seed": args.seed, "alpha": ALPHA, "data": str(data),
                        "seconds": time.perf_counter() - t0},
               "studies": studies, "paired": paired, "notes": notes}
    print(report(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=_default) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
