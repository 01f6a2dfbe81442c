"""W1 as a Flower App (Message API): the ServerApp and ClientApp of the deployment engine."""
