"""Errors dpfl raises on bad input, with messages that name the field, the value and what is allowed."""


class DpflError(Exception):
    """Base class of dpfl's own errors."""


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
