"""Discovery: node, vhost, queue and store dirs under any path, named and classified."""
