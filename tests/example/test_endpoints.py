"""The demo worker endpoints record what they receive and answer as scripted."""

import json
import uuid

import pytest


def post(client, path, body, **headers):
    return client.post(path, data=body, content_type="application/json", headers=headers)


def test_worker_endpoint_records_the_message_and_answers_200(shop, client):
    message_id = uuid.uuid4()

    response = post(
        client,
        "/worker/orders/",
        json.dumps({"order_id": 7, "total": "42.10"}),
        **{
            "pgmb-message-id": str(message_id),
            "pgmb-routing-key": "order.created",
            "pgmb-queue": "order_queue",
            "pgmb-attempt": "2",
            "pgmb-header-source": "shop",
            "authorization": "Bearer not-kept",
        },
    )

    assert response.status_code == 200
    received = shop.Received.objects.get()
    assert response.json() == {"received": received.pk}
    assert (received.endpoint, received.status, received.message_id) == ("orders", 200, message_id)
    assert (received.routing_key, received.queue, received.attempt) == (
        "order.created",
        "order_queue",
        2,
    )
    assert received.body == {"order_id": 7, "total": "42.10"}
    assert received.headers == {
        "content-type": "application/json",
        "pgmb-message-id": str(message_id),
        "pgmb-routing-key": "order.created",
        "pgmb-queue": "order_queue",
        "pgmb-attempt": "2",
        "pgmb-header-source": "shop",
    }


def test_signed_requests_give_the_message_id_as_webhook_id(shop, client):
    message_id = uuid.uuid4()

    post(client, "/worker/audit/", "[1, 2]", **{"webhook-id": str(message_id)})

    received = shop.Received.objects.get()
    assert (received.endpoint, received.message_id, received.body) == ("audit", message_id, [1, 2])
    assert (received.routing_key, received.attempt) == ("", None)


def test_flaky_endpoint_answers_500_and_records_the_attempt(shop, client):
    response = post(client, "/worker/flaky/", '{"n": 1}', **{"pgmb-attempt": "3"})

    assert response.status_code == 500
    assert response.json() == {"error": "flaky by design"}
    assert list(shop.Received.objects.values_list("endpoint", "status", "attempt", "body")) == [
        ("flaky", 500, 3, {"n": 1})
    ]


@pytest.mark.parametrize(
    ("method", "body", "status"),
    [("post", "not json", 400), ("get", None, 405), ("put", "{}", 405)],
)
def test_worker_endpoint_refuses_what_is_not_a_json_post(shop, client, method, body, status):
    kwargs = {"data": body, "content_type": "application/json"} if body is not None else {}

    response = getattr(client, method)("/worker/orders/", **kwargs)

    assert response.status_code == status
    assert not shop.Received.objects.exists()


def test_the_site_root_leads_to_the_admin(shop, client):
    response = client.get("/")

    assert (response.status_code, response["Location"]) == (302, "/admin/")


def test_the_shop_is_in_the_admin(shop, admin_client, make_queue):
    from shop.orders import place_order

    make_queue("order.*")
    order = place_order("Grace", "17.50")

    index = admin_client.get("/admin/").content.decode()
    orders = admin_client.get("/admin/shop/order/").content.decode()

    assert "Example shop" in index
    assert "Message broker" in index
    assert "Grace" in orders
    assert f'href="/admin/pgmb/message/{order.message_id}/change/"' in orders


def test_adding_an_order_in_the_admin_publishes_its_message(shop, admin_client, make_queue):
    from pgmb.models import Delivery, Message

    queue = make_queue("order.*")

    response = admin_client.post(
        "/admin/shop/order/add/",
        {"customer": "Linus", "total": "99.90", "items": '["keyboard"]', "_save": "Save"},
    )

    assert response.status_code == 302
    order = shop.Order.objects.get()
    message = Message.objects.get()
    assert message.id == order.message_id
    assert message.body["customer"] == "Linus"
    assert Delivery.objects.get().queue_id == queue.pk
