"""The paper's published numbers (conf/claims.yaml) and the tables that put the cost model beside them."""
