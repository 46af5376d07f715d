"""The scenario set of the prompt-optimisation loop (seed 004's evaluation scenarios), over a tiny corpus.

The corpus describes a fictional product (the "Aurora-3" weather station of the equally fictional "Kestrel
Instruments"), so a model cannot answer from memory and anything it adds is visibly unsupported; a few
unrelated documents (bread, a library) serve as irrelevant context. Twelve scenarios, ten in English and two in
Japanese, cover every kind seed 004 lists:

====================  ==========================================================================
kind                  what it tests
====================  ==========================================================================
``present``           the answer is stated in one document
``multi_doc``         the answer is spread over several documents that must be combined
``ambiguous``         the query can be read two ways ("how long does it last?")
``long_context``      the answer is one line in a ~1,000-token maintenance log
``no_answer``         the context does not contain the answer: the fixed not-found phrase is required
``conflicting``       two documents disagree; a good answer says so
``irrelevant``        the retrieved context is about something else: the not-found phrase is required
====================  ==========================================================================

Each scenario's ``contexts`` are already sorted by relevance (the input contract's assumption);
``evidence`` lists the exact passages a good answer rests on, ``reference`` the ideal answer (None where
the right reply is the not-found phrase).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.contract import NOT_FOUND, ContextDoc

__all__ = ["CORPUS", "SCENARIOS", "Scenario", "retrieval_dataset"]


def _maintenance_log() -> str:
    """~1,000 tokens of routine log lines with one line that matters (entry 58)."""
    lines = []
    for n in range(1, 81):
        if n == 58:
            lines.append("Log entry 58: the anemometer bearing was replaced with part AB-7731 after it squealed.")
        else:
            lines.append(
                f"Log entry {n}: routine inspection of station ST-{n:03d}; sensors cleaned, radio link checked, "
                "no faults found."
            )
    return "Aurora-3 field maintenance log, network north. " + " ".join(lines)


CORPUS: dict[str, str] = {
    "AUR-01": "The Aurora-3 is a weather station made by Kestrel Instruments. It measures air temperature, relative "
    "humidity and wind speed, and it sends a reading every 10 minutes over LoRa radio to the Aurora hub.",
    "AUR-02": "The Aurora-3 runs on two AA lithium batteries, which last about 14 months at the default reading "
    "interval. The optional SP-2 solar kit keeps the batteries charged, so in sunny locations they never need "
    "replacing.",
    "AUR-03": "Firmware 2.1 added support for the RG-1 rain gauge. Firmware 2.2 fixed a bug that reported wind "
    "speed in knots instead of km/h. Updates are installed from the hub's web page under Settings > Firmware.",
    "AUR-04": "The RG-1 rain gauge is a tipping-bucket gauge that records rainfall in steps of 0.2 mm. It connects "
    "to the Aurora-3 with the 3-pin cable supplied in the box.",
    "AUR-05": "Kestrel Instruments gives the Aurora-3 a 2-year warranty from the date of purchase. The warranty does "
    "not cover damage caused by lightning.",
    "AUR-06": "Aurora-3 spec sheet (2023 edition): operating temperature range -30 °C to +60 °C.",
    "AUR-07": "Aurora-3 user manual, revision C (2024): the station operates between -30 °C and +50 °C.",
    "AUR-09": _maintenance_log(),
    "BAK-01": "A sourdough starter should be fed 4 to 12 hours before you mix the dough.",
    "BAK-02": "Bake the loaf at 230 °C for 20 minutes with the lid on, then for 25 minutes with the lid off.",
    "LIB-01": "The Riverside public library is open from 9:00 to 19:00 on weekdays and is closed on Sundays.",
    "AUR-J1": "Aurora-3は単三リチウム電池2本で動作し、標準の送信間隔では電池は約14か月持ちます。",
    "AUR-J2": "Aurora-3の保証期間は購入日から2年間です。落雷による故障は保証の対象外です。",
}


@dataclass(frozen=True)
class Scenario:
    scenario_id: str
    kind: str
    language: str
    query: str
    context_ids: tuple[str, ...]
    reference: str | None  # None: the right reply is the not-found phrase
    evidence: tuple[tuple[str, str], ...] = ()  # (doc_id, exact passage) a good answer rests on

    @property
    def should_refuse(self) -> bool:
        return self.reference is None

    @property
    def contexts(self) -> list[ContextDoc]:
        return [ContextDoc(i, CORPUS[i]) for i in self.context_ids]

    @property
    def expected_answer(self) -> str:
        return self.reference if self.reference is not None else NOT_FOUND[self.language]


def _s(sid: str, kind: str, lang: str, query: str, ctx: tuple[str, ...], ref: str | None,
       *evidence: tuple[str, str]) -> Scenario:
    for doc_id, passage in evidence:
        if passage not in CORPUS[doc_id]:  # pragma: no cover - a typo in the scenario table
            raise ValueError(f"scenario {sid}: evidence {passage!r} is not in {doc_id}")
    return Scenario(sid, kind, lang, query, ctx, ref, tuple(evidence))


SCENARIOS: tuple[Scenario, ...] = (
    _s("s01-present", "present", "en", "How often does the Aurora-3 send a reading?", ("AUR-01", "AUR-02"),
       "The Aurora-3 sends a reading every 10 minutes, over LoRa radio to the Aurora hub.",
       ("AUR-01", "it sends a reading every 10 minutes over LoRa radio to the Aurora hub")),
    _s("s02-present", "present", "en", "What batteries does the Aurora-3 use?", ("AUR-02", "AUR-01"),
       "It runs on two AA lithium batteries.",
       ("AUR-02", "The Aurora-3 runs on two AA lithium batteries")),
    _s("s03-multi-doc", "multi_doc", "en",
       "Which firmware version added rain gauge support, and in what steps does that gauge record rainfall?",
       ("AUR-03", "AUR-04"),
       "Firmware 2.1 added support for the RG-1 rain gauge, which records rainfall in steps of 0.2 mm.",
       ("AUR-03", "Firmware 2.1 added support for the RG-1 rain gauge."),
       ("AUR-04", "records rainfall in steps of 0.2 mm")),
    _s("s04-multi-doc", "multi_doc", "en", "What does the Aurora-3 measure, and what keeps its batteries charged?",
       ("AUR-01", "AUR-02", "AUR-03"),
       "It measures air temperature, relative humidity and wind speed; the optional SP-2 solar kit keeps its "
       "batteries charged.",
       ("AUR-01", "It measures air temperature, relative humidity and wind speed"),
       ("AUR-02", "The optional SP-2 solar kit keeps the batteries charged")),
    _s("s05-ambiguous", "ambiguous", "en", "How long does the Aurora-3 last?", ("AUR-02", "AUR-05"),
       "Its batteries last about 14 months at the default reading interval; its warranty runs 2 years from the "
       "date of purchase.",
       ("AUR-02", "which last about 14 months at the default reading interval"),
       ("AUR-05", "a 2-year warranty from the date of purchase")),
    _s("s06-long-context", "long_context", "en", "Which part replaced the anemometer bearing?", ("AUR-09", "AUR-01"),
       "The anemometer bearing was replaced with part AB-7731.",
       ("AUR-09", "the anemometer bearing was replaced with part AB-7731")),
    _s("s07-no-answer", "no_answer", "en", "How much does the Aurora-3 cost?", ("AUR-01", "AUR-05", "AUR-02"), None),
    _s("s08-no-answer", "no_answer", "en", "Can the Aurora-3 connect to a phone over Bluetooth?",
       ("AUR-01", "AUR-03"), None),
    _s("s09-conflicting", "conflicting", "en", "What is the highest temperature the Aurora-3 operates at?",
       ("AUR-06", "AUR-07"),
       "The documents disagree on the maximum operating temperature: the 2023 spec sheet gives +60 °C, the 2024 "
       "user manual (revision C) gives +50 °C.",
       ("AUR-06", "operating temperature range -30 °C to +60 °C"),
       ("AUR-07", "the station operates between -30 °C and +50 °C")),
    _s("s10-irrelevant", "irrelevant", "en", "How do I reset the Aurora-3 to factory settings?",
       ("BAK-01", "BAK-02", "LIB-01"), None),
    _s("s11-present-ja", "present", "ja", "Aurora-3の電池はどのくらい持ちますか?", ("AUR-J1", "AUR-J2"),
       "標準の送信間隔では、電池は約14か月持ちます。",
       ("AUR-J1", "標準の送信間隔では電池は約14か月持ちます")),
    _s("s12-no-answer-ja", "no_answer", "ja", "Aurora-3の価格はいくらですか?", ("AUR-J1", "AUR-J2"), None),
)


def retrieval_dataset() -> tuple[dict[str, str], list[dict[str, object]]]:
    """The English corpus and its answerable scenarios as a retrieval test set for the variant sweep.

    Returns ``(corpus, rows)``: every English document (the Japanese ones left out), and for each answerable
    English scenario a row with ``question``, ``reference``, ``relevant_doc_ids`` (its evidence documents) and
    ``group`` (its kind). Unlike the scenario runs, the sweep retrieves the contexts itself from the corpus.
    """
    corpus = {k: v for k, v in CORPUS.items() if not k.startswith("AUR-J")}
    rows: list[dict[str, object]] = [
        {
            "question": s.query,
            "reference": s.reference,
            "relevant_doc_ids": list(dict.fromkeys(d for d, _ in s.evidence)),
            "group": s.kind,
        }
        for s in SCENARIOS
        if s.language == "en" and not s.should_refuse
    ]
    return corpus, rows
