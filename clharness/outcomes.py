"""How a unit of work ends when it does not simply pass (part of the contract: a collecting family's
units raise them too). The engine raises these; the pytest plugin turns them into pytest outcomes
(fail, skip, xfail), the Python API into statuses it returns."""


class Outcome(Exception):
    """A unit's non-passing end, with the message a person reads."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Failed(Outcome):
    """The unit failed: a failed, diverged or errored run, a failed gate, a missing dependency."""


class Skipped(Outcome):
    """Nothing to do here: the method does not support the setting, or is not registered."""


class ExpectedFailure(Outcome):
    """A divergence the protocol expects and counts (GTEP's random search, a selection candidate)."""


# What a unit leaves behind for its front end (the pytest plugin stores them as user properties).
RECORD = "clharness_record"                 # the record, as JSON
REUSED = "clharness_reused"                 # the key of a stored record used instead of a run
REUSED_STALE = "clharness_reused_stale"     # a record made by other code, reused on request (why)
GATE = "clharness_gate"                     # a gate's verdict lines
NOT_REGISTERED = "clharness_not_registered"  # a planned method no plugin registers
SHARED_WITH = "clh_shared_with"             # the unit that trains the run this one shares
