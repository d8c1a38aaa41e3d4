"""Errors dpfl raises on bad input, with messages that name the field, the value and what is allowed."""

import signal


class DpflError(Exception):
    """Base class of dpfl's own errors."""


class ConfigError(DpflError, ValueError):
    """A parameter or configuration value is out of range or of the wrong type."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field} = {value!r} is not allowed: expected {allowed}")


class ConfigWarning(UserWarning):
    """A value dpfl accepts but that is most likely a mistake; the message names the key and why. The command line
    prints it as "dpfl COMMAND: warning: ..." on stderr."""


class BudgetExceededError(DpflError):
    """The next step would spend more privacy than the configured budget."""


class TrainingDivergedError(DpflError):
    """The model's parameters stopped being finite (a learning rate too large for the noise, usually)."""


def check_range(field: str, value, low=None, high=None, *, low_open=False, high_open=False, integer=False):
    """Validates a scalar parameter and returns it; raises ConfigError naming the field and the allowed range."""
    kind = "an integer" if integer else "a number"
    lo = "-inf" if low is None else low
    hi = "inf" if high is None else high
    interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
    allowed = f"{kind} in {interval}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise ConfigError(field, value, allowed)
    if value != value:  # NaN
        raise ConfigError(field, value, allowed)
    if low is not None and (value < low or (low_open and value == low)):
        raise ConfigError(field, value, allowed)
    if high is not None and (value > high or (high_open and value == high)):
        raise ConfigError(field, value, allowed)
    return int(value) if integer else value


#: The noise multipliers z (noise std / l2 sensitivity) and the target epsilons dpfl accepts as input: outside them
#: the accountants' arithmetic leaves the floating-point range (dp_accounting squares z: 1e300 overflows, 1e-300
#: divides by zero; inf is no number), and the values mean nothing a run could use (z = 1e-6 costs epsilon ~ 1e12 a
#: step, z = 1e6 buries an update in noise a million times its size; epsilon = 1e6 protects nothing, 1e-6 calls for
#: noise no model survives).
NOISE_MULTIPLIERS = (1e-6, 1e6)
TARGET_EPSILONS = (1e-6, 1e6)


def check_noise_multiplier(field: str, value) -> float:
    """A noise multiplier given by a user, in ``NOISE_MULTIPLIERS``."""
    return _check_within(field, value, NOISE_MULTIPLIERS, "a noise multiplier (noise std / l2 sensitivity)")


def check_target_epsilon(field: str, value) -> float:
    """A target epsilon given by a user (a budget to calibrate noise to), in ``TARGET_EPSILONS``."""
    return _check_within(field, value, TARGET_EPSILONS, "an epsilon")


#: A delta dpfl accepts (a run's privacy.delta, a command's --delta) is below this: delta is the probability that the
#: epsilon guarantee fails outright, and a delta of 0.1 allows a mechanism that publishes a tenth of the records in full
#: (a run warns about values above 1 / N, N its training records: ``dpfl.experiments.doubtful``).
MAX_DELTA = 0.1


def check_delta(field: str, value) -> float:
    """A delta given by a user: a number in (0, 1) (``check_range``'s message), and below ``MAX_DELTA``."""
    if check_range(field, value, 0, 1, low_open=True, high_open=True) >= MAX_DELTA:
        raise ConfigError(field, value, f"a number in (0, {MAX_DELTA:g}): delta is the probability that the epsilon "
                                        "guarantee fails outright, meant to be well below 1 / N (N the records it "
                                        "protects)")
    return float(value)


def _check_within(field: str, value, bounds: tuple[float, float], what: str) -> float:
    check_range(field, value, 0, low_open=True)  # the type, NaN and sign, with check_range's message
    low, high = bounds
    if not low <= value <= high:
        raise ConfigError(field, value, f"{what} in [{low:g}, {high:g}]: beyond it the accountants' arithmetic "
                                        "overflows and no run means anything")
    return float(value)


class RunDirectoryError(DpflError):
    """A run directory's file (ledger.json, checkpoint.pt, run.json) is missing, unreadable, corrupt, or belongs to a
    different run or config: dpfl refuses rather than start over, so privacy already spent is never forgotten."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped at a round boundary on Ctrl-C or SIGTERM, after checkpointing and writing its results. A
    KeyboardInterrupt, so a caller that does not handle it sees an ordinary interruption. ``signal_number``: the
    signal that stopped it (``dpfl run`` exits with 128 + it: 130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, rounds_done: int, signal_number: int = signal.SIGINT):
        self.rounds_done, self.signal_number = rounds_done, signal_number
        super().__init__(f"interrupted after round {rounds_done}")


class RunAborted(KeyboardInterrupt):
    """A second Ctrl-C or SIGTERM during a run: it aborts at once, mid-round (its ledger already records the round's
    charge). ``signal_number``: that signal."""

    def __init__(self, signal_number: int):
        self.signal_number = signal_number
        super().__init__(f"aborted by signal {signal_number}")


def json_problem(text: str, err) -> str:
    """What is wrong with ``text``, given the json.JSONDecodeError ``err`` it raised: "empty file", "truncated JSON at
    line 3", or the parser's message and position."""
    end = text.rstrip()
    if not end:
        return "empty file"
    cut = len(end.rstrip("0123456789.eE+-"))  # a number cut short ("0.") fails at its last character
    if err.pos >= min(len(end), cut) or err.msg.startswith("Unterminated string"):  # the text stops before the document
        return f"truncated JSON at line {end.count(chr(10)) + 1}"
    return f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}"
