"""Errors dpfl raises on bad input, with messages that name the field, the value and what is allowed."""


class DpflError(Exception):
    """Base class of dpfl's own errors."""


class DpflWarning(UserWarning):
    """A config dpfl runs but whose user should know something (a delta that protects no single record, features far
    from unit scale); `dpfl` prints it as one line, "dpfl: warning: ..."."""


class ConfigError(DpflError, ValueError):
    """A parameter or configuration value is out of range or of the wrong type."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field} = {value!r} is not allowed: expected {allowed}")


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


class RunDirectoryError(DpflError):
    """A run directory's file (ledger.json, checkpoint.pt, run.json) is missing, unreadable, corrupt, or belongs to a
    different run or config: dpfl refuses rather than start over, so privacy already spent is never forgotten."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped at a round boundary on Ctrl-C, after checkpointing and writing its results. A KeyboardInterrupt,
    so a caller that does not handle it sees an ordinary interruption."""

    def __init__(self, rounds_done: int):
        self.rounds_done = rounds_done
        super().__init__(f"interrupted after round {rounds_done}")


def json_problem(text: str, err) -> str:
    """What is wrong with ``text``, given the json.JSONDecodeError ``err`` it raised: "empty file", "truncated JSON at
    line 3", or the parser's message and position."""
    end = text.rstrip()
    if not end:
        return "empty file"
    if err.pos >= len(end) or err.msg.startswith("Unterminated string"):  # the text stops before the document does
        return f"truncated JSON at line {end.count(chr(10)) + 1}"
    return f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}"
