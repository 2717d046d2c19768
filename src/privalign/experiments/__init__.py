"""privalign.experiments"""
