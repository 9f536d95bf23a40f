"""The operator's console: pgmb's models in the Django admin.

Workers, queues and schedules are edited here (their forms check every rule the database
enforces; a schedule's is written through ``pgmb.schedule``);
messages, live deliveries, dead letters and the attempt log are read-only views of what
the broker did, and the dispatchers list shows who does it; the dashboard shows their figures
on one page, with charts of the last hour. Importing this package registers the ModelAdmins
(Django's admin autodiscovery does it).
"""

from .dashboard import DashboardAdmin
from .dispatchers import DispatcherAdmin
from .messages import AttemptAdmin, DeadLetterAdmin, DeliveryAdmin, MessageAdmin
from .schedules import ScheduleAdmin
from .topology import QueueAdmin, WorkerAdmin

__all__ = [
    "AttemptAdmin",
    "DashboardAdmin",
    "DeadLetterAdmin",
    "DeliveryAdmin",
    "DispatcherAdmin",
    "MessageAdmin",
    "QueueAdmin",
    "ScheduleAdmin",
    "WorkerAdmin",
]
