"""privalign.estimation"""
