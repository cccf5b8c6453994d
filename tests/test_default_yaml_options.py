"""default.yaml's comments name only connector options that exist: an operator copies them."""

from __future__ import annotations

import inspect
import re
from importlib import resources

from connectors import REGISTRIES, connector_class
from connectors.kafka import KafkaLedger
from stream_vips.service.build import LEDGERS

TEXT = resources.files("stream_vips").joinpath("data", "default.yaml").read_text(encoding="utf-8")
#: The phrase a comment starts an option list with, and the connector whose options it lists.
LISTS = {
    "kafka ledger": KafkaLedger,
    "kafka source": connector_class("source", "kafka"),
    "kafka sink": connector_class("sink", "kafka"),
    "kafka dead letters": connector_class("dead_letter", "kafka"),
}


def option_lists(text: str) -> dict[str, list[str]]:
    """``{phrase: [named option, ...]}`` from comments ``# <phrase> options: a, b (note), c`` and
    their continuation lines (``#`` and more indentation); notes in parentheses are dropped and
    every other item must be one word."""
    out: dict[str, list[str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        found = re.match(r"\s*# ([a-z ]+) options: (.*)", line)
        if not found:
            continue
        body = found.group(2)
        for more in lines[i + 1:]:
            if not re.match(r"\s*#\s{2,}", more):
                break
            body += " " + more.strip()[1:].strip()
        out[found.group(1)] = [item.strip() for item in re.sub(r"\([^)]*\)", "", body).split(",")]
    return out


def test_every_option_a_comment_names_is_a_parameter_of_its_connector():
    lists = option_lists(TEXT)
    assert set(lists) == set(LISTS)
    for phrase, named in lists.items():
        params = set(inspect.signature(LISTS[phrase]).parameters)
        assert [n for n in named if n not in params] == [], f"default.yaml's {phrase} options name unknown keys"


def test_the_option_check_would_catch_a_refused_key():
    """The finding behind this test: the ledger comment once named ``replication``."""
    wrong = "    # kafka ledger options: bootstrap_servers, topic,\n    #   replication, security\n"
    named = option_lists(wrong)["kafka ledger"]
    assert named == ["bootstrap_servers", "topic", "replication", "security"]
    assert not {"replication", "security"} & set(inspect.signature(KafkaLedger).parameters)


def test_every_type_a_comment_offers_is_registered():
    sections = {"source": REGISTRIES["source"], "sink": REGISTRIES["sink"], "dead_letter": REGISTRIES["dead_letter"],
                "ledger": LEDGERS}
    for section, registry in sections.items():
        block = re.search(rf"^\s*{section}:.*\n\s+type: \w+\s+# ([^\n]*)", TEXT, flags=re.M).group(1)
        offered = {name.split("(")[0].strip() for name in block.split("|")}
        assert offered <= set(registry), f"{section}.type offers {sorted(offered - set(registry))}"
