"""Campaigns: the whole pipeline over one directory, and its results.

The top of the Profiler. Private modules: ``_campaign`` (``validate``:
golden run, playback FI, runtime FI, optionally fuzzing (captures and
``peat.fuzz``), verdict, report), ``_campaign_report`` (a report rebuilt
from a campaign directory, fuzz records included), ``_provenance`` (what
a verdict covers: KUT hash, platform, versions, sites) and ``_results``
(``read_campaign``: a campaign's results as typed data).
"""

from peat_jax.profiler.campaigns._campaign import CampaignPaths as CampaignPaths
from peat_jax.profiler.campaigns._campaign import side_by_side as side_by_side
from peat_jax.profiler.campaigns._campaign import validate as validate
from peat_jax.profiler.campaigns._campaign_report import CampaignFiles as CampaignFiles
from peat_jax.profiler.campaigns._campaign_report import SOURCES as SOURCES
from peat_jax.profiler.campaigns._campaign_report import load_report_data as load_report_data
from peat_jax.profiler.campaigns._campaign_report import read_campaign_files as read_campaign_files
from peat_jax.profiler.campaigns._campaign_report import rebuild_report as rebuild_report
from peat_jax.profiler.campaigns._results import CampaignResults as CampaignResults
from peat_jax.profiler.campaigns._results import CampaignVerdict as CampaignVerdict
from peat_jax.profiler.campaigns._results import EffectRecord as EffectRecord
from peat_jax.profiler.campaigns._results import Finding as Finding
from peat_jax.profiler.campaigns._results import FuzzFinding as FuzzFinding
from peat_jax.profiler.campaigns._results import FuzzRecord as FuzzRecord
from peat_jax.profiler.campaigns._results import FuzzVerdict as FuzzVerdict
from peat_jax.profiler.campaigns._results import Provenance as Provenance
from peat_jax.profiler.campaigns._results import RuntimeRun as RuntimeRun
from peat_jax.profiler.campaigns._results import SiteRecord as SiteRecord
from peat_jax.profiler.campaigns._results import read_campaign as read_campaign
