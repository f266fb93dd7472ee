"""Every detector's settings, one dataclass each, and the table of them `gangwatch config show` lists.

Kept apart from the detectors (which import numpy and the rest of the core) so that reading a setting, a
default or `--help` loads none of them. Each detector takes its own (`FailSlowDetector(topo, FailSlowConfig())`);
`CONFIGS` names them in catalog order, and a contract test holds it equal to what the catalog's detectors take.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BufferConfig:
    lag: int = 2  # close step s once most ranks have reported step s + lag
    close_frac: float = 0.5  # "most ranks": this fraction of the job
    max_open: int = 8  # steps buffered at once; opening one more closes the oldest (once `reorder_s` old) ...
    lateness_s: float = 10.0  # event seconds after its first record that a step closes regardless
    reorder_s: float = 3.0  # event seconds a step waits for ranks sending later (sidecars batch every second)
    reorder_cells: int = 1 << 16  # ... and while steps wait, at most this many rank-values are open (and 64 steps)


@dataclass(frozen=True)
class ClockConfig:
    tolerance_s: float = 2.0  # a node's clock this far off the job's (either way) is corrected and reported
    min_steps: int = 3  # steps an offset rests on before it is applied
    window: int = 16  # a node's offset is the median over its last this many steps
    max_spread_s: float = 1.0  # ... whose deviations agree this well (median absolute deviation): a clock, not noise
    close_frac: float = 0.5  # a step's reference is fixed once this share of the ranks reported it
    sync_s: float = 0.25  # a stage whose ranks' step ends spread more (median absolute deviation) syncs no clock
    keep_steps: int = 256  # step references kept for records that arrive later
    # a node known to run ahead may have its records read that much late (ordered by their stamped times): its
    # silence, and the job's time by clocks of no node, wait for it, up to this long (the lateness bound)
    ahead_wait_max_s: float = 60.0


@dataclass(frozen=True)
class FailStopConfig:
    miss_factor: float = 2.0  # heartbeat periods of silence before a rank is missing ...
    slack_s: float = 0.5  # ... plus this, for heartbeats sent or timestamped a little late
    grace_factor: float = 1.0  # extra periods (+ slack) to wait for the rest of a node before reporting part of it
    tick_s: float = 0.5  # the event-time grid timeouts are evaluated on
    start_timeout_s: float = 600.0  # every rank must have been heard from this long after the job record
    end_window_s: float = 30.0  # a clean exit with most ranks still running this long after it: that rank failed
    prove_max_s: float = 60.0  # longest a silent rank waits for the gang's steps to show it alive (long steps)
    gap_report_s: float = 60.0  # a rank the gang's steps show alive, silent this long: its node's telemetry gap
    # a job of one node falling silent whose node's agent was heard: how long the agent may be silent before its
    # node counts as silent too (about two of its periods: `gangwatch agent` samples NVML every 5 s, the
    # simulator each GPU every 10 s); heard on after the ranks missed a beat, the node lives and the job ended
    agent_wait_s: float = 12.0


@dataclass(frozen=True)
class HangConfig:
    min_stall_s: float = 20.0
    stall_factor: float = 10.0  # x the median step interval
    spike_factor: float = 1.5  # x the longest step interval in the recent window
    window: int = 64  # recent step intervals kept
    warmup_steps: int = 5  # first intervals are not part of the baseline
    max_lagging_frac: float = 0.1  # lagging ranks are reported only when they are this small a minority
    pause_limit_s: float = 600.0  # a known pause of a kind not seen before is a stall after this long ...
    pause_factor: float = 3.0  # ... a later one after this many times the longest of its kind so far ...
    pause_min_s: float = 120.0  # ... but never sooner than this (a few quick saves do not make a slow one a hang)
    ahead_s: float = 2.0  # a step stamped later than the job's time plus this took place at most then (a clock ahead)
    alive_periods: float = 2.0  # no heartbeat this many periods before the threshold: silence, no hang (`hang`)


@dataclass(frozen=True)
class FailSlowConfig:
    warmup_steps: int = 10  # closed steps after a (re)start or rewind that are not scored
    calib_steps: int = 30  # scored steps after a (re)start that learn each rank's usual level (nobody flagged)
    rel_threshold: float = 3.0  # relative robust z at which a step is a hit (with individual support) ...
    ind_threshold: float = 3.0  # ... or individual robust z at which it is one (with relative support)
    support_threshold: float = 2.0  # the other score must be at least this high
    floor_frac: float = 0.02  # spread floor, as a fraction of the stage median (quiet jobs)
    min_peers: int = 4  # fewest ranks with a value for a stage to be compared; smaller stages are pooled
    hits: int = 3  # fewest hits in the last `window` scored steps that flag a rank ...
    window: int = 10
    long_hits: int = 4  # ... or in the last `long_window` (intermittent stragglers); both at most 32 steps
    long_window: int = 30
    false_alarm: float = 1e-9  # chance, per rank and step, that stray hits alone fill a window as needed
    min_hit_rate: float = 1e-4  # the stray-hit rate assumed at least (a quiet job)
    hit_rate_alpha: float = 0.02  # EWMA weight of each rank's stray-hit rate
    rearm_steps: int = 50  # consecutive clean scored steps that end an episode (>= both windows)
    alpha: float = 0.05  # EWMA weight of the individual baseline after calibration
    learn_below: float = 1.0  # a step teaches the baseline while the rank is this close to its peers or itself
    level_alpha: float = 0.05  # EWMA weight of each rank's recent slowness (what a rank's cost is computed from)
    hit_alpha: float = 0.3  # ... and of a straggler's slowness in its hit steps (quick: a ramp keeps climbing)
    het_min_frac: float = 0.02  # heterogeneous: steadily at least this much slower than the stage ...
    het_z: float = 3.0  # ... and this many spreads of the stage's usual slownesses above their median (more in a
    het_false_alarm: float = 0.01  # large stage: noise alone reports one of its ranks with at most this chance) ...
    het_steady: float = 0.8  # ... and slower than the stage's median in at least this share of the steps
    regrow: float = 1.25  # report an episode again when it is this much slower in its slow steps ...
    regrow_min_slowness: float = 0.05  # ... and at least this much (0.05: 5 % of its stage's work) ...
    regrow_min_frac: float = 0.01  # ... and its cost has grown by at least this much of the step ...
    max_reports: int = 8  # ... at most this many times in all
    het_incident_frac: float = 0.10  # a heterogeneous rank costing the job this share of its step is decided on
    min_window_s: float = 8.0  # a straggler is judged over at least this much event time: where `window` steps are
    # shorter (a job of 0.125 s steps: 1.25 s), it stays flagged that much longer before it is reported (a busy
    # host's second of slowness is no straggler)
    het_min_s: float = 60.0  # heterogeneity is judged over at least this much event time (and `calib_steps`): a
    # few seconds of a busy host (a job of short steps calibrates in seconds) make no steady difference
    buffer: BufferConfig = BufferConfig()


@dataclass(frozen=True)
class SlowdownConfig:
    factor: float = 1.5  # job step time / baseline at or above which a step is slow
    min_steps: int = 3  # consecutive slow steps before a finding (one checkpoint step is not an episode)
    rearm_steps: int = 5  # consecutive normal steps that end an episode
    history: int = 50  # the baseline is the median of this many recent normal job step times
    min_history: int = 5  # normal steps needed before there is a baseline
    warmup_steps: int = 10  # steps after a (re)start that are ignored (compilation, cold caches)
    rebaseline_steps: int = 300  # a slowdown this long is the new normal: the baseline restarts from it
    buffer: BufferConfig = BufferConfig()


@dataclass(frozen=True)
class SdcConfig:
    min_majority: int = 2  # fewest agreeing replicas that make a majority
    rearm_steps: int = 100  # agreeing steps after which a flagged rank is watched again
    widespread_frac: float = 0.5  # more shards than this fraction mismatching: job-wide, nobody blamed
    jump_factor: float = 5.0  # job loss / grad_norm over baseline that counts as a jump ...
    z_threshold: float = 6.0  # ... if it is also this many robust sigmas out
    floor_frac: float = 0.01  # spread floor, as a fraction of the baseline
    history: int = 100  # baseline: median of this many recent normal steps
    min_history: int = 10  # normal steps needed before jumps are judged
    numeric_rearm_steps: int = 20  # normal steps that end a numeric episode
    warmup_steps: int = 10  # steps after a (re)start kept out of the numeric baseline and not judged for jumps
    buffer: BufferConfig = BufferConfig()


@dataclass(frozen=True)
class CommConfig:
    window_s: float = 10.0  # collect reports this long after the first one
    quiet_s: float = 60.0  # reports after a storm, closer than this to its last one, belong to it
    max_suspects: int = 8


@dataclass(frozen=True)
class HardwareConfig:
    storm_window_s: float = 2.0  # collect copies of one event this long before reporting it
    quiet_s: float = 60.0  # a storm ends after this much silence
    nic_flap_s: float = 30.0  # a NIC link down that comes back within this is a flap, else fatal
    temp_precursor_c: float = 87.0
    sbe_burst: int = 100  # correctable ECC errors between two samples
    pcie_replay_surge: int = 100
    nvlink_crc_surge: int = 100
    clean_samples: int = 3  # samples without the condition before a GPU condition re-arms


@dataclass(frozen=True)
class StackConfig:
    window_s: float = 30.0  # analyse a partial snapshot this long after its first record
    threads: str = "main"  # which threads make a signature: main | active | all
    distance_threshold: float = 0.3  # cosine distance below which call paths cluster together
    max_outlier_fraction: float = 0.25  # larger clusters are another phase, not suspects
    min_dominant_fraction: float = 0.5  # the healthy cluster must hold at least this share
    min_ranks: int = 3  # fewer dumps than this: nothing to compare
    by_stage: bool = True  # compare ranks only with ranks of the same pipeline stage
    max_distinct: int = 512  # distinct signatures clustered exactly (see `cluster_ranks`)
    max_pending: int = 16  # snapshots collected at once; beyond, the oldest is analysed early
    remember_done: int = 256  # analysed snapshot ids remembered, to drop their late records


@dataclass(frozen=True)
class FlightConfig:
    window_s: float = 30.0  # analyse a partial snapshot this long after its first record
    max_suspect_fraction: float = 0.5  # more ranks behind than this share: no verdict for the group
    min_ranks: int = 2  # fewer dumps than this: nothing to compare
    entries_per_pg: int = 64  # recent collectives kept per rank and group
    max_pending: int = 16  # snapshots collected at once; beyond, the oldest is analysed early
    remember_done: int = 256  # analysed snapshot ids remembered, to drop their late records


@dataclass(frozen=True)
class LinkErrorConfig:
    pcie_replay_per_s: float = 8 / 60  # PCIe replays per second that make an interval bad (8 a minute)
    nvlink_crc_per_s: float = 100.0  # NVLink CRC errors per second, summed over the GPU's links
    hits: int = 3  # bad intervals ...
    window: int = 5  # ... among the last this many of the GPU's sample intervals
    rearm_intervals: int = 10  # consecutive good intervals that end an episode


@dataclass(frozen=True)
class LifeConfig:
    report_running: bool = True  # a finding for every move into `running` (the first step of each run, resumes)


# detector name -> its settings, in catalog order (detectors/catalog.py)
CONFIGS: dict[str, type] = {
    "clocks": ClockConfig,
    "failstop": FailStopConfig,
    "hang": HangConfig,
    "failslow": FailSlowConfig,
    "slowdown": SlowdownConfig,
    "sdc": SdcConfig,
    "comm": CommConfig,
    "hardware": HardwareConfig,
    "stacks": StackConfig,
    "flight": FlightConfig,
    "linkerrors": LinkErrorConfig,
    "life": LifeConfig,
}
