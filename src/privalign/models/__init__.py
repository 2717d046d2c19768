"""privalign.models"""
