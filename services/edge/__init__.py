"""The edge service: MQTT connections in front, partition links behind; holds nothing durable."""
