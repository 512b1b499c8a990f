"""`moelab tune`: search backend x communication SMs x the backend's chunk knobs x schedule for the most
end-to-end tokens/s of one MoE layer, every trial a stored moelab run (moelab.measure.e2e cases)."""

from moelab.tune.search import Trial, TuneConfig, TuneResult, tune
from moelab.tune.space import Candidate

__all__ = ["Candidate", "Trial", "TuneConfig", "TuneResult", "tune"]
