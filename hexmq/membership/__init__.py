"""What the services need of membership, shared by all of them: the client of the node's
membership agent (`client`: the view watch, the leave) and what a view says (`view`: a
partition's master, partition health, whether a node has left). The agent itself is
services/membership, which reads views with these same helpers."""
