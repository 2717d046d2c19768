"""privalign.data"""
