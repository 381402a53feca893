"""What operators look at: Prometheus rules and scrape config, and a Grafana dashboard (docs/observability.md).

Shipped files, beside this module:

- ``rules/boute-recording.yml``: served vs promised per deployment and tier (shares, P95 and TTFT P95 from
  the gateway's histograms, escalations, judge failures, failures and shedding), over 5-minute windows;
- ``rules/boute-alerts.yml``: drift from the promise (a share off the plan, P95 over it, a tier without a
  healthy replica, failures, the judge failing, a gateway not answering);
- ``grafana/boute-dashboard.json``: an import-ready dashboard over those series, one variable (the
  deployment).

:mod:`boute.observability.scrape` writes a ``prometheus.yml`` for a deployment (``boute serve`` /
``boute deploy up --prometheus-config``). Nothing here imports the gateway: the metric names are its
``/metrics`` (``router/metrics.py``), checked against a live gateway by tests/test_prometheus_live.py.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: the rule files, in the order Prometheus loads them (the alerts read the recorded series)
RULE_FILES = ("boute-recording.yml", "boute-alerts.yml")
#: the label every scraped series carries: which deployment (the dashboard's one variable)
DEPLOYMENT_LABEL = "deployment"
#: scrape jobs: the gateways, and the replicas that export metrics (SGLang with --enable-metrics)
GATEWAY_JOB, REPLICA_JOB = "boute-gateway", "boute-replica"


def rules_dir() -> Path:
    return Path(str(resources.files(__name__) / "rules"))


def rule_paths() -> list[Path]:
    return [rules_dir() / name for name in RULE_FILES]


def dashboard_path() -> Path:
    return Path(str(resources.files(__name__) / "grafana" / "boute-dashboard.json"))
