"""The co-design planner: measured verify/draft costs and acceptance -> the best (drafter, D) per
batch size, a draft-length schedule, the cost table adaptive rounds use, and the guidelines checked
on this hardware (`jspec plan`)."""

from jspec.plan.model import pick, rank, schedule  # noqa: F401
