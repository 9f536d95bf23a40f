"""The shop in the admin. Adding an order here publishes its message, like place_order."""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from .models import Order, Received
from .orders import announce


def _message_link(message_id):
    if message_id is None:
        return "-"
    url = reverse("admin:pgmb_message_change", args=[message_id])
    return format_html('<a href="{}">{}</a>', url, message_id)


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "total", "message", "created_at")
    search_fields = ("customer",)
    fields = ("customer", "total", "items", "message", "created_at")
    readonly_fields = ("message", "created_at")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            # The admin saves inside a transaction: the order and its message commit together.
            announce(obj)

    @admin.display(description="order.created message")
    def message(self, obj: Order):
        return _message_link(obj.message_id)


@admin.register(Received)
class ReceivedAdmin(admin.ModelAdmin):
    list_display = (
        "received_at",
        "endpoint",
        "status",
        "routing_key",
        "queue",
        "attempt",
        "message",
    )
    list_filter = ("endpoint", "status", "queue")
    search_fields = ("routing_key",)

    @admin.display(description="message")
    def message(self, obj: Received):
        return _message_link(obj.message_id)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False
