"""A tiny shop: orders publish ``order.created`` through pgmb, and the demo workers'
endpoints record what the broker delivers to them."""
