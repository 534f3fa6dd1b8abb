"""docs/grafana-kvmux.json: valid, and every kvmux series it plots is one kvmux exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvmux.vllm.prom import TIER_COUNTERS, MuxPromMetrics

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-kvmux.json"


def test_every_kvmux_metric_the_dashboard_plots_exists() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = {f"kvmux_tier_{name}_total" for name in TIER_COUNTERS}
    exported |= {f"kvmux_mux_{name}_total" for name in MuxPromMetrics.COUNTERS}
    exported.add("kvmux_mux_breaker_open")
    plotted = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"kvmux_[a-z_]+", target["expr"])
    }
    assert plotted and plotted <= exported, plotted - exported
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
