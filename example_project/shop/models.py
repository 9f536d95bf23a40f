"""The example's own tables: orders (the business data) and what the demo endpoints got."""

import uuid

from django.db import models


class Order(models.Model):
    """An order; created together with its ``order.created`` message (see ``shop.orders``)."""

    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    items = models.JSONField(default=list)
    # The id of the message published with the order, chosen up front so the order can
    # point at it without a second write.
    message_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"order {self.pk} for {self.customer}"


class Received(models.Model):
    """One request a demo worker endpoint received, and the status it answered."""

    endpoint = models.CharField(max_length=50, help_text="The <name> of /worker/<name>/.")
    status = models.PositiveSmallIntegerField(help_text="What the endpoint answered.")
    message_id = models.UUIDField(null=True, blank=True, db_index=True)
    routing_key = models.CharField(max_length=255, blank=True)
    queue = models.CharField(max_length=48, blank=True)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    body = models.JSONField(null=True, blank=True)
    headers = models.JSONField(default=dict, help_text="The pgmb-* and webhook-* headers.")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        verbose_name_plural = "received"

    def __str__(self) -> str:
        return f"{self.endpoint} got {self.routing_key or 'a request'} ({self.status})"
