"""privalign.audit"""
