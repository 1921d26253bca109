"""The demo says whether the job grew onto the node that arrived, and why not when it did not."""

from __future__ import annotations

from controller.eventlog.fact import Fact
from controller.eventlog.facts import GenerationIssued, GrowthDeclined
from spotmorph.commands.demo import ended_before_growth, growth_verdict


def issued(generation: int, cause: str, words: str) -> GenerationIssued:
    return GenerationIssued(generation, "1x4 (P x D), m=4", 0, words, morph_cause=cause)


def declined(free: list[str]) -> GrowthDeclined:
    detail = "1.08x the throughput for a 12 s morph"
    return GrowthDeclined(1, free, "not_worth_it", detail, 100.0, 108.0, None, 12.0)


def test_a_growth_names_its_generation_layout_and_the_policys_words() -> None:
    events: list[Fact] = [issued(1, "admitted", "admitted"), issued(2, "eviction", "eviction notice: node-2")]
    assert growth_verdict(events, ["node-3"]) is None  # not decided yet: the demo keeps waiting
    events.append(issued(3, "grow", "grow: 1.9x the throughput"))
    verdict = growth_verdict(events, ["node-3"])
    assert verdict == "the job grew: generation 3, layout 1x4 (P x D), m=4 (grow: 1.9x the throughput)"


def test_a_declined_growth_onto_the_new_node_says_why_and_an_older_offer_does_not_count() -> None:
    assert growth_verdict([declined(["node-1"])], ["node-3"]) is None  # another node's offer
    verdict = growth_verdict([declined(["node-3"])], ["node-3"])
    assert verdict == "the job did not grow onto node-3: not_worth_it: 1.08x the throughput for a 12 s morph"


def test_a_job_that_ended_first_says_so_and_what_to_change() -> None:
    said = ended_before_growth(["node-3"], {"step": 500})
    assert said.startswith("the job did not grow onto node-3: it finished at step 500 before") and "--steps" in said
