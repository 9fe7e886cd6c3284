"""TPC-DS: data (tpcgen-cli), the 99 query templates as 103 statements (the TPC's kit), exact answers."""
